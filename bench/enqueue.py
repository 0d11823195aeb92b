"""Enqueue: ``enqueue_many`` of 100,000 no-op jobs in one call, and single ``enqueue`` latency.

Both are timed in this process around the public API call (validation, JSON, the round trip and the
commit included). The targets are absolute (150,000 jobs/s; p50 ≤ 0.3 ms); two references from the
same server show the floor underneath them:
- the same rows inserted by one server-side ``INSERT … SELECT … FROM generate_series`` (no client
  work, no parameters): what the table and its indexes cost;
- the same single-row INSERT … RETURNING run by pgbench (1 client, prepared), per-transaction
  latencies logged with ``-l``: one round trip plus the commit's WAL flush, no Python.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from .baseline import run_pgbench
from .common import Context, Figure, checkpoint, fresh_db, percentile, summary_ms
from .tasks import make_app

MANY_TARGET = 150_000.0
SINGLE_P50_TARGET_MS = 0.3

INSERT_ONE = """\
INSERT INTO skiplock.jobs (queue, task, args, priority, max_attempts, run_at)
VALUES ('default', 'noop', '{}'::jsonb, 0, 5, now()) RETURNING id;
"""


def pgbench_insert_latency_ms(ctx: Context, dsn: str, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="skiplock-pgbench-log-") as tmp:
        result = run_pgbench(ctx, dsn, INSERT_ONE, ["-c", "1", "-T", str(max(1, round(seconds))), "-l"],
                             log_dir=Path(tmp))
        lat_us = [int(line.split()[2]) for f in Path(tmp).glob("pgbench_log.*") for line in f.read_text().splitlines()]
    ms = [v / 1000.0 for v in lat_us]
    return {"n": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "mean": statistics.fmean(ms),
            "tps": result["tps"] or 0.0}


def run(ctx: Context) -> list[Figure]:
    z = ctx.sizes
    n = z.enqueue_many
    ctx.log(f"enqueue: enqueue_many of {n:,} jobs; {z.enqueue_single:,} single enqueues")
    with fresh_db(ctx.server, "enqueue_floor") as dsn:
        checkpoint(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            t = time.perf_counter()
            c.execute("INSERT INTO skiplock.jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, %s)", [n])
            floor_rate = n / (time.perf_counter() - t)
        pg_insert = pgbench_insert_latency_ms(ctx, dsn, z.insert_pgbench_seconds)

    with fresh_db(ctx.server, "enqueue") as dsn:
        app = make_app(dsn)
        try:
            app.enqueue_many([("noop", {})] * 100)  # opens the pool; warms the statement
            checkpoint(dsn)
            jobs: list[tuple[str, dict[str, Any]]] = [("noop", {})] * n
            t = time.perf_counter()
            ids = app.enqueue_many(jobs)
            many_s = time.perf_counter() - t
            if len(ids) != n:
                raise RuntimeError(f"enqueue_many returned {len(ids)} ids for {n} jobs")
            for _ in range(50):
                app.enqueue("noop", {})
            single: list[float] = []
            for _ in range(z.enqueue_single):
                t = time.perf_counter()
                app.enqueue("noop", {})
                single.append(time.perf_counter() - t)
        finally:
            app.close()
    many_rate = n / many_s
    lat = summary_ms(single)
    ctx.raw["enqueue"] = {"enqueue_many_jobs": n, "enqueue_many_s": many_s, "single_ms": lat,
                          "server_floor_rows_per_s": floor_rate, "pgbench_insert_ms": pg_insert}
    ctx.log(f"enqueue: {many_rate:,.0f} jobs/s in one enqueue_many; single enqueue p50 {lat['p50']:.3f} ms")
    s = "enqueue"
    return [
        Figure(s, f"enqueue_many of {n:,} jobs", many_rate, "jobs/s", baseline_or_target=MANY_TARGET,
               reference="target", goal=">= 1", details={"seconds": many_s}),
        Figure(s, "  floor: same rows by one INSERT … SELECT generate_series", floor_rate, "rows/s",
               note="server-side only; enqueue_many cannot beat it"),
        Figure(s, "single enqueue p50", lat["p50"], "ms", baseline_or_target=SINGLE_P50_TARGET_MS,
               reference="target", goal="<= 1", details=lat),
        Figure(s, "single enqueue p99", lat["p99"], "ms"),
        Figure(s, "  floor: pgbench same INSERT, 1 client, p50", pg_insert["p50"], "ms",
               note="one round trip + commit, no Python", details=pg_insert),
    ]
