"""Drain throughput: N queued no-op jobs, one worker process (the public CLI), until all are durably done.

Throughput is N divided by the time from the first claim (the earliest ``started_at``: the claim
transaction's start) to the last completion (the latest ``finished_at``, taken just before its
COMMIT), both on the server's clock, so Python start-up is not counted, just as pgbench's TPS
excludes its connection time. The worker process's wall time (spawn to exit) is reported alongside.
With several processes (the many-workers scenario) the figure is taken over the window in which all
of them were working, so their staggered start-up on two cores does not count against them.
Worker CPU per job subtracts the CPU of a worker that starts and stops on an empty queue.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .common import (Context, DbCounters, Figure, checkpoint, fresh_db, one, per_job_us, settle, table_stats,
                     worker_summary)
from .tasks import make_app


def enqueue_noops(dsn: str, n: int, chunk: int = 50_000) -> None:
    """Through the public API; then ANALYZE, so the claim is planned with current statistics (as it is
    once autovacuum has seen the table) instead of whatever the first claims happen to get."""
    app = make_app(dsn)
    try:
        for start in range(0, n, chunk):
            app.enqueue_many([("noop", {})] * min(chunk, n - start))
    finally:
        app.close()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ANALYZE skiplock.jobs")


def startup_cpu(ctx: Context) -> float:
    """CPU of a worker process that finds the queue empty: imports, connections, shutdown."""
    if "worker.startup_cpu_s" not in ctx.refs:
        with fresh_db(ctx.server, "startup") as dsn:
            samples = [ctx.worker(dsn, max(ctx.drain_concurrency)).wait(60).cpu_s for _ in range(2)]
        ctx.refs["worker.startup_cpu_s"] = min(samples)
    return ctx.refs["worker.startup_cpu_s"]


def check_drained(dsn: str, n: int) -> dict[str, Any]:
    """Every job done exactly once; the first-claim-to-last-completion span; and the window in which
    every worker process was working (from the last process's first claim to the first process's
    last completion), which leaves out the staggered start of several processes on a small machine."""
    with psycopg.connect(dsn) as c:
        states: dict[str, int] = dict(c.execute("SELECT state, count(*) FROM skiplock.jobs GROUP BY state").fetchall())
        span, reruns = one(c, 
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8,"
            "       count(*) FILTER (WHERE attempts <> 1)"
            "  FROM skiplock.jobs WHERE state = 'done'")
        procs, window, in_window = one(c, 
            "WITH p AS (SELECT min(started_at) AS s, max(finished_at) AS f FROM skiplock.jobs WHERE state = 'done'"
            "            GROUP BY regexp_replace(worker, '/[^/]*$', '')),"
            "     w AS (SELECT count(*) AS procs, max(s) AS ws, min(f) AS we FROM p)"
            " SELECT procs, extract(epoch FROM we - ws)::float8,"
            "        (SELECT count(*) FROM skiplock.jobs WHERE state = 'done' AND finished_at > ws AND finished_at <= we)"
            "   FROM w")
    if states.get("done", 0) != n or len(states) != 1:
        raise RuntimeError(f"expected {n} jobs done, found {states}")
    usable = window is not None and window > 0.2 * float(span) and in_window > 0
    return {"states": states, "span_s": float(span), "jobs_with_attempts_not_1": reruns, "processes_seen": procs,
            "all_active_window_s": window, "jobs_in_window": in_window,
            "throughput_span": n / float(span),
            "throughput": in_window / window if usable else n / float(span),
            "throughput_basis": "all-processes-active window" if usable else "whole span"}


def drain_once(ctx: Context, label: str, n: int, processes: int, concurrency: int) -> dict[str, Any]:
    """Enqueue ``n`` no-ops, run ``processes`` workers with ``concurrency`` slots until empty, measure."""
    with fresh_db(ctx.server, label) as dsn:
        enqueue_noops(dsn, n)
        checkpoint(dsn)
        cpu = ctx.cpu()
        before = DbCounters.read(dsn, cpu)
        workers = [ctx.worker(dsn, concurrency) for _ in range(processes)]
        finished = [w.wait(timeout=max(120.0, n / 50)) for w in workers]
        settle(dsn)
        after = DbCounters.read(dsn, cpu)
        checked = check_drained(dsn, n)
        checked["table_after"] = table_stats(dsn)
    summaries = [worker_summary(f.stderr) for f in finished]
    return {
        "jobs": n, "processes": processes, "concurrency": concurrency,
        "wall_s": max(f.wall_s for f in finished),
        "worker_cpu_s": sum(f.cpu_s for f in finished),
        "worker_user_s": sum(f.user_s for f in finished), "worker_sys_s": sum(f.sys_s for f in finished),
        "returncodes": [f.returncode for f in finished],
        "workers": summaries,
        "counters": before.delta(after),
        **checked,
    }


def run(ctx: Context) -> list[Figure]:
    n = ctx.sizes.drain_jobs
    startup = startup_cpu(ctx)
    figures: list[Figure] = []
    best = 0.0
    for c in ctx.drain_concurrency:
        ctx.log(f"drain: {n:,} no-op jobs, 1 worker process, concurrency {c}")
        r = drain_once(ctx, f"drain_c{c}", n, 1, c)
        ctx.raw[f"drain_c{c}"] = r
        if r["returncodes"] != [0] or r["workers"][0]["done"] != n:
            raise RuntimeError(f"drain worker: exit {r['returncodes']}, log summary {r['workers']}")
        counters = r["counters"]
        worker_cpu = max(0.0, r["worker_cpu_s"] - startup)
        best = max(best, r["throughput"])
        ctx.log(f"drain: {r['throughput']:,.0f} jobs/s (wall {r['wall_s']:.1f}s)")
        s = f"drain (c={c})"
        figures += [
            Figure(s, f"drain throughput, {n:,} no-op jobs, 1 process × {c} slots", r["throughput"], "jobs/s",
                   reference="pgbench claim TPS", baseline_key="baseline.claim_tps", goal=">= 1.5",
                   details={"wall_s_incl_startup": r["wall_s"], "span_s": r["span_s"]}),
            Figure(s, "drain throughput against the batched ceiling", r["throughput"], "jobs/s",
                   reference="pgbench rows/s, 50 per transaction", baseline_key="baseline.batched_rows_per_s",
                   goal=">= 0.5"),
            Figure(s, "worker CPU per job (start-up excluded)", per_job_us(worker_cpu, n), "µs/job",
                   reference="pgbench client CPU per tx", baseline_key="baseline.client_cpu_us"),
            Figure(s, "server CPU per job", per_job_us(counters["server_cpu_s"], n), "µs/job",
                   reference="pgbench server CPU per tx", baseline_key="baseline.server_cpu_us"),
            Figure(s, "WAL per job", counters["wal_bytes"] / n, "bytes/job",
                   reference="pgbench WAL per tx", baseline_key="baseline.wal_bytes"),
            Figure(s, "transactions committed per job", counters["xact_commit"] / n, "xacts/job",
                   note="pgbench: 1 per claim"),
        ]
    ctx.refs["drain.throughput"] = best
    return figures
