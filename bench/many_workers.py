"""Many workers: 8 worker processes × 8 slots drain the same queue on one server.

Checks that claiming does not collapse under contention (throughput at least the 1-process drain
figure of the same run), that PostgreSQL recorded no deadlock in the database, and that nothing went
wrong: every process exits 0, no worker logs a warning or error, every job is done exactly once
(one attempt each, and the workers' own counts add up to the number of jobs).
"""

from __future__ import annotations

from .common import Context, Figure, per_job_us
from .drain import drain_once, startup_cpu


def run(ctx: Context) -> list[Figure]:
    z = ctx.sizes
    n, p, c = z.many_jobs, z.many_processes, z.many_concurrency
    ctx.log(f"many workers: {n:,} no-op jobs, {p} processes × {c} slots")
    startup = startup_cpu(ctx)
    r = drain_once(ctx, "many", n, p, c)
    ctx.raw["many_workers"] = r
    counted = sum(w["done"] or 0 for w in r["workers"])
    errors = (sum(1 for rc in r["returncodes"] if rc != 0) + sum(w["problems"] for w in r["workers"])
              + sum((w["failed"] or 0) + (w["retried"] or 0) for w in r["workers"])
              + r["jobs_with_attempts_not_1"] + abs(counted - n))
    deadlocks = r["counters"]["deadlocks"]
    ctx.log(f"many workers: {r['throughput']:,.0f} jobs/s, {deadlocks} deadlocks, {errors} errors")
    s = f"many workers ({p}×{c})"
    return [
        Figure(s, f"drain throughput, {n:,} jobs, {p} processes × {c} slots", r["throughput"], "jobs/s",
               reference="1-process drain throughput (best of this run)", baseline_key="drain.throughput",
               goal=">= 1.0", details={k: r[k] for k in ("wall_s", "span_s", "throughput_span", "throughput_basis",
                                                        "all_active_window_s", "jobs_in_window", "processes_seen")}),
        Figure(s, "throughput vs pgbench claim TPS", r["throughput"], "jobs/s",
               reference="pgbench claim TPS", baseline_key="baseline.claim_tps"),
        Figure(s, "deadlocks (pg_stat_database)", deadlocks, "count", baseline_or_target=0, goal="== 0",
               goal_on="value"),
        Figure(s, "errors", errors, "count",
               baseline_or_target=0, goal="== 0", goal_on="value",
               note="non-zero exits + warning/error log lines + retried/failed jobs + jobs run more than once "
                    "+ mismatch between the workers' counts and the jobs",
               details={"problem_lines": [line for w in r["workers"] for line in w["problem_lines"]][:20]}),
        Figure(s, "worker CPU per job (all processes, start-up excluded)",
               per_job_us(max(0.0, r["worker_cpu_s"] - p * startup), n), "µs/job",
               reference="pgbench client CPU per tx", baseline_key="baseline.client_cpu_us"),
        Figure(s, "server CPU per job", per_job_us(r["counters"]["server_cpu_s"], n), "µs/job",
               reference="pgbench server CPU per tx", baseline_key="baseline.server_cpu_us"),
    ]
