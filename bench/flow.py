"""Flow control's claim throughput (docs/flow-control.md), each as a ratio to the unlimited drain
measured in the same run (``drain``): as many no-op jobs as the drain (a quarter as many, as first
written, made runs of about a second whose ratios moved by ±0.3 from one run to the next), one
worker process with the drain's slots, until all are done -- the same measurement as bench/drain.py
(first claim to last completion, server clock).

- ``limits``: a per-partition limit (``concurrency=2, partition_by="k"``) over 1,000 keys and a
  global limit of 50 on their queue (neither binds at this concurrency -- a batch holds one slot of
  each key for all its jobs -- so this is what enforcing them costs);
- ``rate``: a rate far above the drain (1,000,000/min): what taking a start costs;
- ``fair``: a fair queue, jobs over 1,000 partitions: what the round-robin claim costs;
- ``sequences``: jobs over 1,000 sequences (``sequence_by``): what the blocked state and the
  promotion of each sequence's next job cost (these jobs are claimed by the plain claim, in batches).
- ``behind``: the unlimited drain's plain no-ops, enqueued after ``BEHIND_BACKLOG`` jobs of a
  queue limited to one start an hour (so they stay queued, ahead of the plain jobs in claim order),
  drained by a worker of every queue: what a limited queue's backlog costs the plain claims
  (migration 17: nothing, they are not on the plain claims' index; before it, each claim read every
  one of them). Its throughput counts the plain jobs only (first claim to last completion); the
  worker is stopped once they are done.

``BENCH_FLOW_CASES=limits,fair`` runs only those cases (with the drain).

Flow-controlled jobs of fast tasks are claimed in batches like plain ones (jobs with a rate one at a
time). Each case also logs its commits and rollbacks per job (every session of the database). The
issue's goal: >= 0.8 x unlimited for limits and fairness.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from .common import Context, DbCounters, Figure, checkpoint, fresh_db, one, per_job_us, settle
from .drain import check_drained, startup_cpu
from .tasks import FLOW_ENV, add_flow_tasks, make_app

PARTITIONS = 1000
CASES = {
    "limits": ("noop_limited", "flow_limited", {"concurrency": 50}),
    "rate": ("noop_rated", "flow_rated", None),
    "fair": ("noop_fair", "flow_fair", {"fair": True}),
    "sequences": ("noop_sequenced", "flow_sequences", None),
    "behind": ("noop", "flow_behind", {"rate": "1/h"}),
}
# The ``behind`` case's jobs of its limited queue, ahead of the plain ones.
BEHIND_BACKLOG = 20_000


def _us(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} µs"


def run(ctx: Context) -> list[Figure]:
    n = ctx.sizes.drain_jobs  # as many as the drain: the same share of start-up in both
    concurrency = max(ctx.drain_concurrency)
    startup = startup_cpu(ctx)
    figures: list[Figure] = []
    only = [c for c in os.environ.get("BENCH_FLOW_CASES", "").split(",") if c]  # e.g. "limits,fair"
    for case, (task, queue, queue_limits) in CASES.items():
        if only and case not in only:
            continue
        ctx.log(f"flow: {case}, {n:,} no-op jobs, 1 worker process, concurrency {concurrency}")
        with fresh_db(ctx.server, f"flow_{case}") as dsn:
            app = make_app(dsn)
            add_flow_tasks(app)
            try:
                if queue_limits is not None:
                    app.set_queue_limits(queue, **queue_limits)
                if case == "behind":  # the limited queue's backlog first (lower ids), then the plain jobs
                    app.enqueue_many([(task, {}, {"queue": queue})] * BEHIND_BACKLOG)
                    app.enqueue_many([(task, {})] * n)
                else:
                    args = [({"k": i % PARTITIONS} if case == "limits" else {"s": i % PARTITIONS}
                             if case == "sequences" else {}) for i in range(n)]
                    opts = [({"partition": f"p{i % PARTITIONS}"} if case == "fair" else {}) for i in range(n)]
                    app.enqueue_many([(task, a, o) for a, o in zip(args, opts)])
            finally:
                app.close()
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("ANALYZE skiplock.jobs")
            checkpoint(dsn)
            cpu = ctx.cpu()
            before = DbCounters.read(dsn, cpu)
            if case == "behind":
                finished = _drain_behind(ctx, dsn, n, concurrency)
            else:
                finished = ctx.worker(dsn, concurrency, env={FLOW_ENV: "1"}).wait(timeout=max(120.0, n / 20))
            if finished.returncode != 0:
                raise RuntimeError(f"flow {case} worker: exit {finished.returncode}\n{finished.stderr[-2000:]}")
            settle(dsn)  # the worker's sessions have ended: their statistics and CPU are in
            counters = before.delta(DbCounters.read(dsn, cpu))
            checked = _plain_drained(dsn, n) if case == "behind" else check_drained(dsn, n)
        per_job: dict[str, float | None] = {"commits": round(counters["xact_commit"] / n, 2),
                                            "rollbacks": round(counters["xact_rollback"] / n, 2)}
        # CPU per job, as the drain reports it: where a case's time goes (the worker's Python or the server)
        per_job["worker_cpu_us"] = per_job_us(max(0.0, finished.cpu_s - startup), n)
        per_job["server_cpu_us"] = per_job_us(counters["server_cpu_s"], n)
        ctx.raw[f"flow_{case}"] = {"jobs": n, "concurrency": concurrency, "wall_s": finished.wall_s,
                                   "per_job": per_job, **checked}
        ctx.log(f"flow: {case}: {checked['throughput']:,.0f} jobs/s; per job: {per_job['commits']} commits, "
                f"{per_job['rollbacks']} rollbacks (every session of the database, the worker's bookkeeping too), "
                f"worker CPU {_us(per_job['worker_cpu_us'])}, server CPU {_us(per_job['server_cpu_us'])}")
        what = (f"plain claim throughput, {n:,} no-op jobs behind {BEHIND_BACKLOG:,} of a limited queue"
                if case == "behind" else f"claim throughput, {n:,} no-op jobs")
        figures.append(Figure(f"flow ({case})", f"{what}, 1 process x {concurrency} slots",
                              checked["throughput"], "jobs/s", reference="unlimited drain",
                              baseline_key="drain.throughput",
                              goal=">= 0.8" if case in ("limits", "fair", "behind") else None))
    return figures


def _drain_behind(ctx: Context, dsn: str, n: int, concurrency: int) -> Any:
    """The ``behind`` case's worker: it never finds its queues empty (the limited queue's jobs wait
    for their starts), so it is stopped once the ``n`` plain jobs are done."""
    worker = ctx.worker(dsn, concurrency, stop_when_empty=False, env={FLOW_ENV: "1"})
    deadline = time.monotonic() + max(120.0, n / 20)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            while one(c, "SELECT count(*) FROM skiplock.jobs WHERE queue = 'default' AND state = 'done'")[0] < n:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"flow behind: the plain jobs were not drained\n{worker.result and worker.result.stderr[-2000:]}")
                time.sleep(0.1)
    finally:
        worker.signal()
    return worker.wait(60)


def _plain_drained(dsn: str, n: int) -> dict[str, Any]:
    """The ``behind`` case's plain jobs: every one done exactly once, and their first claim to last
    completion (the limited queue's jobs are left out: at most one of them ran)."""
    with psycopg.connect(dsn) as c:
        done, span, reruns = one(c, "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8,"
                                    "       count(*) FILTER (WHERE attempts <> 1)"
                                    "  FROM skiplock.jobs WHERE queue = 'default' AND state = 'done'")
        behind_done = one(c, "SELECT count(*) FROM skiplock.jobs WHERE queue = 'flow_behind' AND state = 'done'")[0]
    if done != n or reruns:
        raise RuntimeError(f"flow behind: {done} of {n} plain jobs done, {reruns} with attempts <> 1")
    return {"span_s": float(span), "throughput": n / float(span), "jobs_with_attempts_not_1": reruns,
            "limited_queue_jobs_done": behind_done, "limited_queue_backlog": BEHIND_BACKLOG}
