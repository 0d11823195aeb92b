"""The benchmark's tasks: a no-op, and one that records when its handler started (for wake-up latency).

Worker processes load ``bench.tasks:app`` through the public command line (``--dsn`` configures it);
in-process scenarios call :func:`make_app` with their database's DSN.
"""

from __future__ import annotations

import time
from typing import Any

import skiplock

# The latency scenario creates this table in its database before any ``stamp`` job runs.
LATENCY_TABLE = "CREATE TABLE bench_latency (job_id bigint PRIMARY KEY, handler_start float8 NOT NULL)"


def make_app(dsn: str | None = None) -> skiplock.App:
    app = skiplock.App(dsn)

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

    return app


app = make_app()
