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

    return app


app = make_app()
