"""Wake-up latency: jobs enqueued one at a time at a steady rate into an idle worker process.

Per job, latency = handler start − enqueue commit:
- enqueue commit: ``time.time()`` in the producer right after ``app.enqueue`` returns (the INSERT has
  committed on the producer's autocommit connection);
- handler start: ``time.time()`` taken first thing in the handler, inside the worker process, and
  stored in the job's own transaction (``bench.tasks.stamp``).
Both read the same system clock of this machine. The worker is started through the public CLI,
waits until all its slots are connected and idle, and is measured with the default poll interval
and with ``--poll-interval 0.01``. An idle window before the jobs shows what polling costs in CPU.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from .common import Context, DbCounters, Figure, fresh_db, one, settle, summary_ms, wait_for_sessions, worker_summary
from .tasks import LATENCY_TABLE, make_app

P50_TARGET_MS = 1.0
P99_TARGET_MS = 3.0


def measure(ctx: Context, label: str, poll_interval: float | None) -> dict[str, Any]:
    z = ctx.sizes
    conc = ctx.latency_concurrency
    total = int(z.latency_rate * z.latency_seconds)
    with fresh_db(ctx.server, label) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(LATENCY_TABLE)
        worker = ctx.worker(dsn, conc, stop_when_empty=False, poll_interval=poll_interval)
        app = make_app(dsn)
        try:
            wait_for_sessions(dsn, "skiplock-worker", conc)
            app.enqueue("noop", {})  # opens the producer's pool; the worker runs it
            time.sleep(1.0)
            cpu = ctx.cpu()
            idle0, wcpu0 = DbCounters.read(dsn, cpu), worker.cpu_now()
            time.sleep(z.latency_idle_seconds)
            idle1, wcpu1 = DbCounters.read(dsn, cpu), worker.cpu_now()

            committed: dict[int, float] = {}
            enqueue_s: list[float] = []
            interval = 1.0 / z.latency_rate
            t0 = time.perf_counter()
            for i in range(total):
                delay = t0 + i * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                before = time.perf_counter()
                job_id = app.enqueue("stamp", {})
                committed[job_id] = time.time()
                enqueue_s.append(time.perf_counter() - before)
            produce_s = time.perf_counter() - t0
            deadline = time.monotonic() + 30
            with psycopg.connect(dsn, autocommit=True) as c:
                while one(c, "SELECT count(*) FROM bench_latency")[0] < total:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the worker did not run every latency job within 30 s")
                    time.sleep(0.02)
                busy1, wcpu2 = DbCounters.read(dsn, cpu), worker.cpu_now()
                stamps: dict[int, float] = dict(c.execute("SELECT job_id, handler_start FROM bench_latency").fetchall())
        finally:
            app.close()
            worker.signal()
        finished = worker.wait(30)
        settle(dsn)
    latencies = [stamps[j] - t for j, t in committed.items()]
    idle = idle0.delta(idle1)
    busy = idle1.delta(busy1)
    return {
        "poll_interval": poll_interval, "concurrency": conc, "jobs": total, "rate": z.latency_rate,
        "achieved_rate": total / produce_s,
        "latency_ms": summary_ms(latencies),
        "enqueue_ms": summary_ms(enqueue_s),
        "idle_window_s": idle["seconds"],
        "idle_worker_cores": (wcpu1 - wcpu0) / idle["seconds"],
        "idle_server_cores": None if idle["server_cpu_s"] is None else idle["server_cpu_s"] / idle["seconds"],
        "idle_xacts_per_s": (idle["xact_commit"] + idle["xact_rollback"]) / idle["seconds"],
        "busy_worker_cores": (wcpu2 - wcpu1) / busy["seconds"],
        "busy_server_cores": None if busy["server_cpu_s"] is None else busy["server_cpu_s"] / busy["seconds"],
        "worker_exit": finished.returncode,
        "worker": worker_summary(finished.stderr),
    }


def run(ctx: Context) -> list[Figure]:
    z = ctx.sizes
    figures: list[Figure] = []
    for label, poll in (("default", None), ("fast", 0.01)):
        poll_text = "default poll interval (0.5 s)" if poll is None else f"poll interval {poll} s"
        ctx.log(f"latency: {z.latency_rate:.0f} jobs/s for {z.latency_seconds:.0f} s into an idle worker, {poll_text}")
        r = measure(ctx, f"latency_{label}", poll)
        ctx.raw[f"latency_{label}"] = r
        lat = r["latency_ms"]
        ctx.log(f"latency: p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms")
        s = f"latency ({'poll 0.5 s' if poll is None else f'poll {poll} s'})"
        figures += [
            Figure(s, "wake-up latency p50 (enqueue commit → handler start)", lat["p50"], "ms",
                   baseline_or_target=P50_TARGET_MS, reference="target", goal="<= 1", details=lat),
            Figure(s, "wake-up latency p99", lat["p99"], "ms", baseline_or_target=P99_TARGET_MS, reference="target",
                   goal="<= 1"),
            Figure(s, "worker CPU while idle (polling)", r["idle_worker_cores"] * 100, "% of a core"),
            Figure(s, "server CPU while idle (polling)", None if r["idle_server_cores"] is None
                   else r["idle_server_cores"] * 100, "% of a core",
                   details={"transactions_per_s": r["idle_xacts_per_s"]}),
            Figure(s, f"worker CPU at {z.latency_rate:.0f} jobs/s (incl. polling)", r["busy_worker_cores"] * 100, "% of a core"),
        ]
    return figures

