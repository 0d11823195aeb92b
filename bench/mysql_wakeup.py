"""``python -m bench.mysql_wakeup``: wake-up latency and idle cost of the MySQL backend's listener.

MySQL/MariaDB have no LISTEN/NOTIFY; ``backend/mysql/notifications.py`` polls one O(1) statement
with an adaptive interval (5 ms after activity, growing by 1.5 per empty poll to 100 ms). Measured
here, on one listener (``connect_listener``) of a real MySQLBackend:

- ``enqueue``: the time from an enqueue's COMMIT returning to the listener's ``wait`` handing back
  the wake payload, after an idle gap of ``--gap`` seconds (so the interval has grown to its
  maximum: the idle worst case), p50/p99 in ms over ``--rounds`` enqueues;
- ``waiter``: the same from a job's ``done`` COMMIT to its waiter's notice (``add_waiter`` +
  ``complete``);
- ``idle_queries_per_s``: statements the listener ran per second while nothing happened for
  ``--idle`` seconds (its cost on the server, per worker process).

Prints JSON. With no ``--dsn`` it starts the tests' private MariaDB (tests/mariadb_server.py) and
stops it after. Run under the shared lock: ``flock -x /tmp/skiplock-bench.lock .venv/bin/python -m
bench.mysql_wakeup``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _percentiles(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max_ms": round(ms[-1], 2), "n": len(ms)}


class _Watcher:
    """A thread in ``listener.wait`` (as the worker's Listener runs it), stamping each payload's arrival."""

    def __init__(self, listener: Any):
        self.listener = listener
        self.arrived: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            for payload in self.listener.wait(0.25):
                with self.cond:
                    self.arrived[payload] = time.perf_counter()
                    self.cond.notify_all()

    def expect(self, payload: str, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while payload not in self.arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no wake-up {payload!r} within {timeout} s")
                self.cond.wait(left)
            return self.arrived.pop(payload)


def run(dsn: str, rounds: int, gap: float, idle: float) -> dict[str, Any]:
    from skiplock.backend.base import NewJob
    from skiplock.backend.mysql import MySQLBackend

    backend = MySQLBackend(dsn)
    backend.migrate()
    listener = backend.connect_listener()
    watcher = _Watcher(listener)
    job = NewJob("t", "{}", "default", 0, 3, None)
    try:
        enq: list[float] = []
        for _ in range(rounds):
            time.sleep(random.uniform(gap, gap * 1.5))
            watcher.arrived.pop(backend.wake_payload, None)
            backend.enqueue([job])
            t0 = time.perf_counter()
            enq.append((watcher.expect(backend.wake_payload) - t0) * 1000)
        waiter: list[float] = []
        lease = backend.connect_lease("bench")
        for _ in range(rounds):
            job_id = backend.enqueue([job._replace(queue="waited")])[0]
            backend.add_waiter(job_id)
            (c,) = backend.claim(lease, ["waited"])
            assert c.id == job_id, "the bench's job was not claimed"
            time.sleep(random.uniform(gap, gap * 1.5))
            watcher.arrived.clear()
            assert backend.complete(lease, c, 1, None, c.claimed_at, "bench/0")
            lease.commit()
            t0 = time.perf_counter()
            waiter.append((watcher.expect(backend.notice(job_id)) - t0) * 1000)
        lease.close()
        time.sleep(1.0)  # let the interval reach its maximum
        before, t0 = listener.polls, time.perf_counter()
        time.sleep(idle)
        idle_qps = (listener.polls - before) / (time.perf_counter() - t0)
        return {"enqueue": _percentiles(enq), "waiter": _percentiles(waiter),
                "idle_queries_per_s": round(idle_qps, 2),
                "min_interval_s": listener.min_interval, "max_interval_s": listener.max_interval,
                "gap_s": gap}
    finally:
        watcher.stop = True
        watcher.thread.join(2)
        listener.close()
        backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="mysql://… of an existing server (a database skiplock may use)")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.3, help="idle seconds before each wake-up")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the idle cost is measured over")
    args = parser.parse_args(argv)
    server = None
    dsn = args.dsn
    if dsn is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import mariadb_server  # the tests' private server

        server = mariadb_server.start()
        dsn = server.dsn(mariadb_server.fresh_database(server))
    try:
        out = run(dsn, args.rounds, args.gap, args.idle)
        out["server"] = "MariaDB (tests/mariadb_server.py)" if server is not None else "given --dsn"
        print(json.dumps(out, indent=2))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
