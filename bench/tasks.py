"""The benchmark's tasks: a no-op, sleeps, and two that tell when their handler started (latency).

Worker processes load ``bench.tasks:app`` through the public command line (``--dsn`` configures it);
in-process scenarios call :func:`make_app` with their database's DSN.

``BENCH_DONE_RETENTION_S`` in the environment (the soak sets it for its workers) makes the app keep
done jobs that many seconds instead of skiplock's default day, so a run longer than that reaches the
steady state of a deployment whose pruner keeps up.
"""

from __future__ import annotations

import os
import time
from typing import Any

import skiplock

RETENTION_ENV = "BENCH_DONE_RETENTION_S"

# The latency scenario creates this table in its database before any ``stamp`` job runs.
LATENCY_TABLE = "CREATE TABLE bench_latency (job_id bigint PRIMARY KEY, handler_start float8 NOT NULL)"


# Flow control's scenario (bench/flow.py) sets this in its workers' environment: the app then also
# registers flow-controlled no-ops (docs/flow-control.md), which no other scenario's workers carry.
FLOW_ENV = "BENCH_FLOW"


def add_flow_tasks(app: skiplock.App) -> None:
    @app.task(name="noop_limited", queue="flow_limited", concurrency=2, partition_by="k")
    def noop_limited(job: Any, k: int) -> None:
        """A no-op with a per-partition limit (its queue has a global one, set by the scenario)."""

    @app.task(name="noop_rated", queue="flow_rated", rate="1000000/min")
    def noop_rated(job: Any) -> None:
        """A no-op with a rate far above what is drained: what a rate check costs."""

    @app.task(name="noop_fair", queue="flow_fair")
    def noop_fair(job: Any) -> None:
        """A no-op in a fair queue (set by the scenario), partitioned at enqueue."""

    @app.task(name="noop_sequenced", queue="flow_sequences", sequence_by="s")
    def noop_sequenced(job: Any, s: int) -> None:
        """A no-op in one of the scenario's sequences (one at a time, in order, per value of ``s``)."""


def make_app(dsn: str | None = None) -> skiplock.App:
    done_retention = os.environ.get(RETENTION_ENV)
    retention = None if not done_retention else {"done": float(done_retention), "failed": 30 * 86400.0,
                                                  "cancelled": 7 * 86400.0}
    app = skiplock.App(dsn, retention=retention)

    @app.task(name="noop")
    def noop(job: Any) -> None:
        """Does nothing: the job's cost is skiplock's own."""

    @app.task(name="sleep")
    def sleep(job: Any, ms: float) -> None:
        """Waits ``ms`` milliseconds without touching the database (the sweep's 1 ms and 10 ms jobs)."""
        time.sleep(ms / 1000)

    @app.task(name="write")
    def write(job: Any) -> None:
        """Inserts one row into ``bench_writes`` in the job's transaction -- so the handler runs in a
        savepoint of its own: a subtransaction, as every writing handler's in a batch (the sweep's
        writing jobs, against which ``batch_size`` is weighed: PostgreSQL caches 64 subtransaction
        ids per transaction)."""
        job.conn.execute("INSERT INTO bench_writes (job_id) VALUES (%s)", [job.id])

    @app.task(name="write_nested")
    def write_nested(job: Any) -> None:
        """``write`` in a savepoint of its own within the job's (as an ORM session joined with a
        savepoint writes, or Django's ``atomic()``): two subtransaction ids per job in a batch."""
        with job.conn.transaction():
            job.conn.execute("INSERT INTO bench_writes (job_id) VALUES (%s)", [job.id])

    @app.task(name="stamp")
    def stamp(job: Any) -> None:
        """Records the wall-clock time (the system clock the producer also reads) at handler start; the row
        commits with the job, so a stamp exists exactly for the jobs that are done."""
        started = time.time()
        job.conn.execute("INSERT INTO bench_latency (job_id, handler_start) VALUES (%s, %s)", [job.id, started])

    @app.task(name="pickup")
    def pickup(job: Any, ms: float) -> float:
        """Returns the wall-clock time at handler start (the job's result, written with its done) and
        then waits ``ms`` milliseconds, without touching the database: the load scenario's 1 ms job,
        whose pickup latency is this result minus the job's ``created_at``."""
        started = time.time()
        time.sleep(ms / 1000)
        return started

    if os.environ.get(FLOW_ENV):
        add_flow_tasks(app)
    return app


app = make_app()

