"""Scaling with backlog: claim throughput with 1,000,000 queued jobs vs with 10,000 queued.

"B queued" means at least B jobs stay queued for the whole measurement: the table gets
B + warm-up + measured claims (+ a margin) jobs, inserted by one ``INSERT … SELECT generate_series``
on the server (not through Python), then ``VACUUM ANALYZE`` and a ``CHECKPOINT``. One worker process
(as in the drain scenario, same slots) then runs the no-op jobs; this process only watches the count
of done jobs (every 0.2 s) to know when to stop it. Throughput comes from the server's completion
times: (jobs finished between the warm-up-th and the last completion) / (time between them). A time
cap bounds each measurement, so a pathologically slow claim cannot stall the run (the JSON says when
it applied). Both backlogs use the same worker, slots and counts, so only the backlog differs.

A third measurement puts ``DELAYED`` jobs not yet due (``run_at`` an hour ahead) before the small
backlog -- lower ids, as a failed job waiting out its retry backoff keeps its old id -- and reports its
throughput against the small backlog's: what jobs waiting for their time cost the claims (before
migration 18 the claim order was (priority, id) and each claim read every one of them from the heap;
now (priority, run_at, id), with run_at a key of the claim indexes).

Two more put ``AHEAD`` due jobs of another queue before the small backlog (lower ids): one claimed by a
worker of two named queues that does not serve that queue (``--queues default,x``: what a foreign
backlog costs a worker over several queues), one by a worker of every queue with that queue paused
(what a paused backlog costs); and a worker of the two named queues with nothing ahead (what the merged
claim itself costs against the claim of every queue). The worker of every queue walks jobs_claim_any_idx, whose entries do not
hold the queue, so each such job costs its every claim a heap read (docs/benchmarks.md, "Session 20").
The worker of named queues merges one walk of jobs_claim_idx per queue (``claim_of_queues_merged``,
"Session 21"), which never reads another queue's jobs.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from .common import Context, Figure, checkpoint, fresh_db, one, spawn_worker, table_stats, worker_summary

# Jobs not yet due ahead of the small backlog in the third measurement.
DELAYED = 20_000
# Due jobs of another queue ahead of it in the last two (a foreign queue's, a paused queue's).
AHEAD = 20_000


def measure(ctx: Context, backlog: int, claims: int, warmup: int, concurrency: int,
            max_seconds: float, delayed: int = 0, ahead: int = 0, paused: bool = False,
            named: bool = False) -> dict[str, Any]:
    """``delayed``: jobs not yet due ahead of the backlog; ``ahead``: due jobs of queue 'other' ahead of
    it, left alone by a worker of queues 'default' and 'x' (``named``) -- or, with ``paused``, by a
    worker of every queue, 'other' being paused."""
    rows = backlog + warmup + claims + 4 * concurrency
    with fresh_db(ctx.server, f"backlog_{backlog}_{delayed}_{ahead}_{int(named)}") as dsn:
        t = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as c:
            if delayed:  # first: the lower ids, ahead of the due jobs in id order
                c.execute("INSERT INTO skiplock.jobs (task, run_at) SELECT 'noop', now() + interval '1 hour'"
                          "  FROM generate_series(1, %s)", [delayed])
            if ahead:
                c.execute("INSERT INTO skiplock.jobs (task, queue) SELECT 'noop', 'other' FROM generate_series(1, %s)",
                          [ahead])
                if paused:
                    c.execute("INSERT INTO skiplock.paused_queues (queue) VALUES ('other')")
            c.execute("INSERT INTO skiplock.jobs (task) SELECT 'noop' FROM generate_series(1, %s)", [rows])
            c.execute("VACUUM ANALYZE skiplock.jobs")
        setup_s = time.perf_counter() - t
        checkpoint(dsn)
        if named:  # a worker of two named queues, not 'other' (bench.worker: app.worker(queues=...))
            worker = spawn_worker(dsn, concurrency, stop_when_empty=False,
                                  options={**ctx.worker_options, "queues": ["default", "x"]})
        else:
            worker = ctx.worker(dsn, concurrency, stop_when_empty=False)
        started = time.monotonic()
        capped = False
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    time.sleep(0.2)
                    done = one(c, "SELECT count(*) FROM skiplock.jobs WHERE state = 'done'")[0]
                    if done >= warmup + claims:
                        break
                    if time.monotonic() - started > max_seconds * 1.5:
                        capped = True
                        break
                    if worker.poll() is not None:
                        raise RuntimeError(f"backlog worker exited early: {worker.result.stderr[-2000:]}")  # type: ignore[union-attr]
        finally:
            worker.signal()
        finished = worker.wait(60)
        stats = table_stats(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            done, queued = one(c, "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'queued')"
                                  "  FROM skiplock.jobs")
            # skip the warm-up (or, when capped, the first third of the completions)
            skip = min(warmup, done // 3)
            first, last, n = one(
                c, "SELECT min(finished_at), max(finished_at), count(*) - 1 FROM ("
                   "  SELECT finished_at FROM skiplock.jobs WHERE state = 'done' ORDER BY finished_at OFFSET %s) f",
                [skip])
    if n is None or n < 1 or first is None:
        raise RuntimeError(f"backlog {backlog}: only {done} jobs done")
    seconds = (last - first).total_seconds()
    return {"backlog": backlog, "delayed_ahead": delayed, "other_queue_ahead": ahead, "other_queue_paused": paused,
            "named_queues": named,
            "rows": rows, "setup_s": setup_s, "done": done, "claims_measured": n,
            "seconds": seconds, "throughput": n / seconds, "queued_after": queued, "concurrency": concurrency,
            "capped_at_max_seconds": capped, "worker_exit": finished.returncode,
            "worker": worker_summary(finished.stderr), "table_after": stats}


def run(ctx: Context) -> list[Figure]:
    z = ctx.sizes
    conc = max(ctx.drain_concurrency)
    out: dict[int, dict[str, Any]] = {}
    for backlog in (z.backlog_small, z.backlog_large):
        ctx.log(f"backlog: {backlog:,} queued, {z.backlog_claims:,} claims measured, 1 process × {conc} slots")
        out[backlog] = r = measure(ctx, backlog, z.backlog_claims, z.backlog_warmup, conc, z.backlog_max_seconds)
        ctx.log(f"backlog: {r['throughput']:,.0f} jobs/s over {r['claims_measured']:,} claims "
                f"(set-up {r['setup_s']:.1f}s{', time cap reached' if r['capped_at_max_seconds'] else ''})")
    ctx.log(f"backlog: {z.backlog_small:,} queued behind {DELAYED:,} not yet due, 1 process × {conc} slots")
    behind = measure(ctx, z.backlog_small, z.backlog_claims, z.backlog_warmup, conc, z.backlog_max_seconds,
                     delayed=DELAYED)
    ctx.log(f"backlog: {behind['throughput']:,.0f} jobs/s over {behind['claims_measured']:,} claims "
            f"behind {DELAYED:,} not yet due")
    others: dict[str, dict[str, Any]] = {}
    for ahead, paused in ((0, False), (AHEAD, False), (AHEAD, True)):
        what = (f"behind {AHEAD:,} of a paused queue, a worker of every queue" if paused
                else f"behind {AHEAD:,} of another queue, a worker of two named queues" if ahead
                else "a worker of two named queues")
        ctx.log(f"backlog: {z.backlog_small:,} queued, {what}, 1 process × {conc} slots")
        others[what] = r = measure(ctx, z.backlog_small, z.backlog_claims, z.backlog_warmup, conc, z.backlog_max_seconds,
                                   ahead=ahead, paused=paused, named=not paused)
        ctx.log(f"backlog: {r['throughput']:,.0f} jobs/s over {r['claims_measured']:,} claims {what}"
                f"{' (time cap reached)' if r['capped_at_max_seconds'] else ''}")
    small, large = out[z.backlog_small], out[z.backlog_large]
    ctx.raw["backlog"] = {**{str(k): v for k, v in out.items()}, f"{z.backlog_small}_behind_{DELAYED}_delayed": behind,
                          **{f"{z.backlog_small} {what}": r for what, r in others.items()}}
    ctx.refs["backlog.small"] = small["throughput"]
    s = "backlog"
    return [
        Figure(s, f"claim throughput, {z.backlog_small:,} queued", small["throughput"], "jobs/s",
               reference="pgbench claim TPS", baseline_key="baseline.claim_tps", details=small),
        Figure(s, f"claim throughput, {z.backlog_large:,} queued", large["throughput"], "jobs/s",
               reference=f"throughput with {z.backlog_small:,} queued", baseline_key="backlog.small",
               goal=">= 0.8", details=large),
        Figure(s, f"claim throughput, {z.backlog_small:,} queued behind {DELAYED:,} not yet due",
               behind["throughput"], "jobs/s", reference=f"throughput with {z.backlog_small:,} queued",
               baseline_key="backlog.small", goal=">= 0.8", details=behind),
        *(Figure(s, f"claim throughput, {z.backlog_small:,} queued, {what}", r["throughput"], "jobs/s",
                 reference=f"throughput with {z.backlog_small:,} queued", baseline_key="backlog.small",
                 goal=">= 0.8", details=r) for what, r in others.items()),
    ]
