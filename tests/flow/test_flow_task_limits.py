"""Task limits changed at runtime (docs/flow-control.md; migration 16): a ``task_limits`` row replaces
the limits in the task's code in a running worker -- here a task with ``concurrency=3`` in code held to
1 -- and clearing it brings the code's limits back, both without a restart; the runs recorded in the
handler (database clock, committed with the job) show which limit held."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from support import wait_for

import skiplock
from skiplock.errors import ConfigurationError

OVERLAP = """
SELECT coalesce(max(n), 0) FROM (
  SELECT (SELECT count(*) FROM flow_runs o WHERE o.started <= r.started AND o.ended > r.started) AS n
    FROM flow_runs r WHERE %(since)s::timestamptz IS NULL OR r.started >= %(since)s) x"""


def make_app(dsn: str) -> skiplock.App:
    app = skiplock.App(dsn)

    @app.task("capped", queue="tl", concurrency=3)
    def capped(job, n):
        started = job.conn.execute("SELECT clock_timestamp()").fetchone()[0]
        time.sleep(0.1)
        job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                         "VALUES (%s, '', %s, clock_timestamp(), pg_backend_pid())", (job.id, started))

    return app


def done(db: psycopg.Connection[Any]) -> int:
    return db.execute("SELECT count(*) FROM flow_runs").fetchone()[0]


def test_a_runtime_task_limit_replaces_the_codes_live_and_clearing_brings_it_back(
        dsn: str, runs: psycopg.Connection[Any]) -> None:
    app = make_app(dsn)
    app.set_task_limits("capped", concurrency=1)
    assert [(t["task"], t["concurrency"], t["rate"]) for t in app.task_limits()] == [("capped", 1, None)]
    worker = app.worker(concurrency=4, poll_interval=0.05, handle_signals=False, adaptive_limit=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        app.enqueue_many([("capped", {"n": i}) for i in range(10)])
        wait_for(lambda: done(runs) == 10, timeout=60, what="the first jobs")
        assert runs.execute(OVERLAP, {"since": None}).fetchone()[0] == 1  # 4 slots, the runtime limit of 1
        app.set_task_limits("capped", clear=True)
        wait_for(lambda: [t.concurrency for t in worker.flow.limits] == [3], timeout=30,  # type: ignore[union-attr]
                 what="the worker to read the change")
        since = runs.execute("SELECT clock_timestamp()").fetchone()[0]
        app.enqueue_many([("capped", {"n": i}) for i in range(10, 30)])
        wait_for(lambda: done(runs) == 30, timeout=60, what="every job")
        assert 2 <= runs.execute(OVERLAP, {"since": since}).fetchone()[0] <= 3  # the code's limit again
    finally:
        worker.stop()
        thread.join(30)
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == 30
    assert app.task_limits() == []
    app.close()


def test_bad_task_limits_are_refused(app: skiplock.App) -> None:
    with pytest.raises(ConfigurationError, match="concurrency must be a whole number"):
        app.set_task_limits("t", concurrency=0)
    with pytest.raises(ConfigurationError, match="rate must look like"):
        app.set_task_limits("t", rate="often")
    with pytest.raises(ConfigurationError, match="clear=True or limits, not both"):
        app.set_task_limits("t", concurrency=2, clear=True)
    assert app.task_limits() == []
