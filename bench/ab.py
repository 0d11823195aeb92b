"""``python -m bench.ab``: two or more revisions of skiplock side by side, cell by cell, on one server.

On a noisy machine a whole ``python -m bench --rev A`` and ``--rev B`` minutes apart compare the
machine's moods as much as the code. This alternates instead: every round runs each cell once per
revision, one right after the other, each revision's ``src/`` exported with ``git archive`` (never
the working tree, so an edit made while it runs changes nothing) and put first on the workers'
``PYTHONPATH``; the harness itself (bench/) is the working tree's for all of them. Then it prints, as
JSON, every run's figures and each revision's ratio to the first one, round by round and of medians.

Cells (repeatable, any mix):

- ``--drain MS:JOBS:PxS`` -- a sweep cell (``bench.sweep.cell``, warm: the workers start first, the
  jobs arrive in one transaction): ``JOBS`` jobs of ``MS`` ms (0: no-op) on ``P`` processes x ``S``
  slots; throughput, worker and server CPU per job, jobs-table buffers per job.
- ``--load PxS:RATE`` -- pickup latency at a fixed offered rate (``bench.load.offered``): ``RATE``
  jobs/s of 1 ms jobs for ``--load-seconds`` after 5 s of warm-up; p50 / p99 / max, and the split
  insert -> claim, claim -> handler start.

Example: ``python -m bench.ab --rev e4bf4ee --rev HEAD --drain 0:20000:1x16 --drain 0:20000:1x4 --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from typing import Any, Callable

from .common import FULL, Context, export_revision, start_embedded


# A cell: its name, how to run it once, and the figures whose ratios the summary gives.
Cell = tuple[str, Callable[[Context], dict[str, Any]], tuple[str, ...]]


def _drain_cell(spec: str) -> Cell:
    from . import sweep

    try:
        ms, jobs, shape = spec.split(":")
        processes, slots = shape.lower().split("x")
        args = int(ms), int(jobs), int(processes), int(slots)
    except ValueError:
        raise SystemExit(f"--drain {spec!r}: expected MS:JOBS:PxS, e.g. 0:20000:1x16") from None

    def run(ctx: Context) -> dict[str, Any]:
        c = sweep.cell(ctx, *args)
        return {"throughput": c["throughput"], "worker_cpu_us_per_job": c["worker_cpu_us_per_job"],
                "server_cpu_us_per_job": c["server_cpu_us_per_job"], "jobs_buffers_per_job": c["jobs_buffers_per_job"]}
    return f"drain {args[0]} ms {args[2]}x{args[3]} ({args[1]} jobs)", run, ("throughput", "server_cpu_us_per_job")


def _load_cell(spec: str, seconds: float) -> Cell:
    from . import load

    try:
        shape, rate_text = spec.split(":")
        processes, slots = (int(x) for x in shape.lower().split("x"))
        rate = float(rate_text)
    except ValueError:
        raise SystemExit(f"--load {spec!r}: expected PxS:RATE, e.g. 2x16:2600") from None

    def run(ctx: Context) -> dict[str, Any]:
        r = load.offered(ctx, f"ab_load_{processes}x{slots}", processes, slots, rate, seconds, 5.0)
        lat, i2c, c2h = r["latency_ms"] or {}, r["insert_to_claim_ms"] or {}, r["claim_to_handler_ms"] or {}
        return {"p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "max_ms": lat.get("max"),
                "insert_to_claim_p99_ms": i2c.get("p99"), "claim_to_handler_p99_ms": c2h.get("p99"),
                "offered_in_window": r["offered_in_window"]}
    return f"load {processes}x{slots} at {rate:g} jobs/s", run, ("p99_ms",)


def _ratios(values: dict[str, list[Any]], first: str, key: str) -> dict[str, Any]:
    """Per revision: its ``key`` over the first revision's, round by round and of the medians."""
    base = [v[key] for v in values[first]]
    out: dict[str, Any] = {}
    for rev, runs in values.items():
        mine = [v[key] for v in runs]
        pairs = [m / b if (m is not None and b) else None for m, b in zip(mine, base)]
        known = [m for m in mine if m is not None]
        known_base = [b for b in base if b is not None]
        out[rev] = {"values": mine, "per_round": pairs,
                    "of_medians": (statistics.median(known) / statistics.median(known_base))
                    if known and known_base and statistics.median(known_base) else None}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", action="append", required=True, help="a git revision (two or more; the first is the reference)")
    p.add_argument("--drain", action="append", default=[], metavar="MS:JOBS:PxS")
    p.add_argument("--load", action="append", default=[], metavar="PxS:RATE")
    p.add_argument("--load-seconds", type=float, default=20.0, help="each --load cell's measured window [20]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    if len(args.rev) < 2:
        p.error("give two or more --rev")
    if not args.drain and not args.load:
        p.error("give at least one --drain or --load cell")
    cells = [_drain_cell(s) for s in args.drain] + [_load_cell(s, args.load_seconds) for s in args.load]
    revisions: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for rev in args.rev:
        info, src = export_revision(rev)
        label = f"{rev} ({info['commit'][:8]})"
        revisions[label], sources[label] = info, src
    base_path = os.environ.get("PYTHONPATH", "")
    server = start_embedded(None, 1200)
    ctx = Context(server=server, sizes=FULL, drain_concurrency=[8], latency_concurrency=8,
                  log=lambda *a: None)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {name: {label: [] for label in revisions} for name, _, _ in cells}
    try:
        for round_ in range(args.rounds):
            for name, run, _ in cells:
                for label, src in sources.items():
                    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in [src, base_path] if x)
                    figures = run(ctx)
                    results[name][label].append(figures)
                    print(f"round {round_ + 1}: {name}, {label}: "
                          + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items() if isinstance(v, (int, float))),
                          file=sys.stderr, flush=True)
    finally:
        os.environ["PYTHONPATH"] = base_path
        server.close()
        for info in revisions.values():
            shutil.rmtree(info["export_dir"], ignore_errors=True)
    first = next(iter(revisions))
    summary = {name: {key: _ratios(results[name], first, key) for key in keys} for name, _, keys in cells}
    report = {"revisions": revisions, "rounds": args.rounds, "reference": first, "runs": results, "ratios": summary}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
