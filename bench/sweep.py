"""Slot and process sweep (issue 16, goal 1): does throughput hold as a worker gets more slots, and
as a fixed number of slots is spread over more processes?

For jobs of 0, 1 and 10 ms (``noop``, ``sleep``), each cell drains a prefilled queue with the public
worker CLI until it is empty and reports, besides throughput (as in the drain scenario: first claim to
last completion, on the server's clock), what the issue asks to watch:

- MultiXact SLRU reads per job (``pg_stat_slru``, multixact_offset + multixact_member, reset per cell;
  the cluster-wide view, so nothing else may run on the server meanwhile);
- buffer accesses per job on the jobs table and its indexes (``pg_statio_user_tables``: heap + index
  hits and reads, every statement of the cell, not the claim alone).

Each cell's throughput is compared with the previous cell of its series (the goal: non-decreasing
within noise, >= 0.9). Then the batching defaults (``batch_size`` 32, ``batch_slots`` 1,
``batch_budget`` 0.05 s) against their neighbours, one setting at a time, at 1 × 16 slots for 0 and
1 ms jobs, each as a ratio to the defaults' cell (issue 16, goal 5: the defaults are those the sweep
shows best). Opt-in (``--only sweep``): it is not part of a plain ``python -m bench``.
256 slots need ~520 connections: a server this run starts gets ``max_connections = 1200`` (one
restart before anything is measured: ``start_embedded``); on another server the cells that do not fit
are skipped, saying so.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .common import Context, Figure, checkpoint, fresh_db, one, settle
from .drain import check_drained
from .tasks import make_app

SLOTS = (4, 16, 64, 256)
PROCESSES = (1, 2, 4, 8)   # at TOTAL_SLOTS slots in all
TOTAL_SLOTS = 64
KINDS = {0: 20_000, 1: 10_000, 10: 2_000}  # job length (ms) -> jobs per cell
QUICK_KINDS = {0: 4_000, 1: 2_000, 10: 400}
MAX_CONNECTIONS = 1200
DEFAULTS_SLOTS = 16
# Each batching setting beside its default (worker/batching.py), the others at their defaults.
DEFAULT_NEIGHBOURS = (("batch_size", 8), ("batch_size", 16), ("batch_size", 64), ("batch_slots", 2),
                      ("batch_slots", 4), ("batch_budget", 0.02), ("batch_budget", 0.1))


def _max_connections(ctx: Context) -> int:
    with psycopg.connect(ctx.server.dsn, autocommit=True) as c:
        return int(one(c, "SHOW max_connections")[0])


def _counters(dsn: str) -> tuple[float, float]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        mx = one(c, "SELECT coalesce(sum(blks_hit + blks_read), 0) FROM pg_stat_slru WHERE name ILIKE 'multixact%%'")[0]
        buf = one(c, "SELECT coalesce(heap_blks_hit + heap_blks_read + idx_blks_hit + idx_blks_read, 0) "
                     "FROM pg_statio_user_tables WHERE relid = 'skiplock.jobs'::regclass")[0]
    return float(mx), float(buf)


def cell(ctx: Context, ms: int, n: int, processes: int, slots: int) -> dict[str, Any]:
    with fresh_db(ctx.server, f"sweep_{ms}ms_{processes}x{slots}") as dsn:
        app = make_app(dsn)
        try:
            for start in range(0, n, 50_000):
                app.enqueue_many([("noop", {}) if ms == 0 else ("sleep", {"ms": ms})] * min(50_000, n - start))
        finally:
            app.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("VACUUM ANALYZE skiplock.jobs")
            c.execute("SELECT pg_stat_reset_slru()")
        checkpoint(dsn)
        mx0, buf0 = _counters(dsn)
        workers = [ctx.worker(dsn, slots) for _ in range(processes)]
        finished = [w.wait(timeout=max(300.0, n / 20)) for w in workers]
        failed = [f for f in finished if f.returncode]
        if failed:  # before the count: a worker that could not start says why
            raise RuntimeError(f"sweep worker exit codes {[f.returncode for f in finished]}: "
                               f"{failed[0].stderr[-2000:]}")
        settle(dsn)
        mx1, buf1 = _counters(dsn)
        try:
            checked = check_drained(dsn, n)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; the first worker's log ends: {finished[0].stderr[-2000:]}") from None
    return {"ms": ms, "jobs": n, "processes": processes, "slots_per_process": slots,
            "throughput": checked["throughput"], "span_s": checked["span_s"],
            "multixact_reads_per_job": (mx1 - mx0) / n, "jobs_buffers_per_job": (buf1 - buf0) / n}


def run(ctx: Context) -> list[Figure]:
    kinds = QUICK_KINDS if ctx.sizes.drain_jobs < 20_000 else KINDS
    available = _max_connections(ctx)
    figures: list[Figure] = []
    results: list[dict[str, Any]] = []
    series = [("slots", [(1, s) for s in SLOTS]), ("processes", [(p, TOTAL_SLOTS // p) for p in PROCESSES])]
    for ms, n in kinds.items():
        for axis, cells in series:
            previous: str | None = None
            for processes, slots in cells:
                label = f"{processes} × {slots}"
                if processes * (2 * slots + 3) + 10 > available:
                    ctx.log(f"sweep: {ms} ms, {label}: skipped, needs more than max_connections = {available}")
                    continue
                key = f"sweep.{ms}ms.{processes}x{slots}"
                if key in ctx.refs:  # 1 × 64 is in both series: measured once
                    r = next(x for x in results if x["ms"] == ms and x["processes"] == processes
                             and x["slots_per_process"] == slots)
                else:
                    ctx.log(f"sweep: {n:,} jobs of {ms} ms, {label} slots")
                    r = cell(ctx, ms, n, processes, slots)
                    results.append(r)
                    ctx.refs[key] = r["throughput"]
                    ctx.log(f"sweep: {r['throughput']:,.0f} jobs/s, MultiXact {r['multixact_reads_per_job']:.2f}/job, "
                            f"buffers {r['jobs_buffers_per_job']:.1f}/job")
                scenario = f"sweep {ms} ms ({axis})"
                figures.append(Figure(scenario, f"throughput, {label} slots", r["throughput"], "jobs/s",
                                      reference="previous cell" if previous else "", baseline_key=previous,
                                      goal=">= 0.9" if previous else None))
                figures.append(Figure(scenario, f"MultiXact SLRU reads per job, {label}", r["multixact_reads_per_job"],
                                      "reads/job"))
                figures.append(Figure(scenario, f"jobs-table buffer accesses per job, {label}",
                                      r["jobs_buffers_per_job"], "buffers/job"))
                previous = key
    ctx.raw["sweep"] = results
    figures += _defaults(ctx, kinds, available)
    return figures


def _defaults(ctx: Context, kinds: dict[int, int], available: int) -> list[Figure]:
    """Issue 16, goal 5: the batching defaults against their neighbours, at DEFAULTS_SLOTS slots for 0
    and 1 ms jobs (each setting alone, the others at their defaults), through ``bench.worker``
    (``app.worker(**options)``). Each figure is a ratio to the defaults' cell measured just before."""
    figures: list[Figure] = []
    rows: list[dict[str, Any]] = []
    slots = DEFAULTS_SLOTS
    if 2 * slots + 13 > available:
        ctx.log(f"sweep defaults: skipped, needs more than max_connections = {available}")
        return figures
    saved = ctx.worker_options
    try:
        for ms in (0, 1):
            n = kinds[ms]
            ctx.worker_options = {**saved, "listen": True}  # bench.worker with the defaults
            base = cell(ctx, ms, n, 1, slots)
            key = f"sweep.defaults.{ms}ms"
            ctx.refs[key] = base["throughput"]
            rows.append({**base, "options": "defaults"})
            ctx.log(f"sweep defaults: {ms} ms, defaults {base['throughput']:,.0f} jobs/s")
            figures.append(Figure(f"sweep defaults {ms} ms", f"throughput, the defaults, 1 × {slots}", base["throughput"], "jobs/s"))
            for option, value in DEFAULT_NEIGHBOURS:
                ctx.worker_options = {**saved, "listen": True, option: value}
                r = cell(ctx, ms, n, 1, slots)
                rows.append({**r, "options": f"{option}={value}"})
                ctx.log(f"sweep defaults: {ms} ms, {option}={value} {r['throughput']:,.0f} jobs/s")
                figures.append(Figure(f"sweep defaults {ms} ms", f"throughput, {option} = {value}, 1 × {slots}",
                                      r["throughput"], "jobs/s", reference="the defaults' cell", baseline_key=key))
    finally:
        ctx.worker_options = saved
    ctx.raw["sweep_defaults"] = rows
    return figures
