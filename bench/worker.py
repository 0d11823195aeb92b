"""``python -m bench.worker``: a worker process with options the command line may not offer yet.

The benchmark normally runs workers through the public CLI (``python -m skiplock worker``). When
``python -m bench --worker-option KEY=VALUE`` is given (e.g. ``batch_size=10``, ``listen=false``,
``queues=["default"]``), workers run through this runner instead: the same public API the CLI calls
(``app.worker(**options).run(stop_when_empty=...)``), the same log format and the same final
"stopped:" line, so the scenarios read both alike. ``BENCH_DEBUG_LOGGERS`` (comma-separated logger
names) logs those at DEBUG, e.g. ``skiplock.worker.governor``: every move of the lease limit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from .tasks import make_app

DEBUG_LOGGERS_ENV = "BENCH_DEBUG_LOGGERS"  # comma-separated loggers to log at DEBUG whatever --log-level says


def parse_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker")
    p.add_argument("--dsn", required=True)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--poll-interval", type=float)
    p.add_argument("--stop-when-empty", action="store_true")
    p.add_argument("--option", action="append", type=parse_option, default=[], help="KEY=VALUE for app.worker()")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args()
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in filter(None, os.environ.get(DEBUG_LOGGERS_ENV, "").split(",")):  # e.g. the governor's moves
        logging.getLogger(name.strip()).setLevel(logging.DEBUG)
    app = make_app(args.dsn)
    options = dict(args.option)
    if args.poll_interval is not None:
        options["poll_interval"] = args.poll_interval
    options.setdefault("freeze_gc", True)  # as `skiplock worker` does by default
    worker = app.worker(concurrency=args.concurrency, **options)
    log = logging.getLogger("skiplock.worker")
    log.info("worker %s (bench runner) with %d slot(s), options %s", worker.name, args.concurrency, options)
    stats = worker.run(stop_when_empty=args.stop_when_empty)
    log.info("worker %s stopped: %d done, %d retried, %d failed", worker.name, stats.done, stats.retried, stats.failed)
    app.close()
    return 1 if stats.aborted else 0


if __name__ == "__main__":
    sys.exit(main())
