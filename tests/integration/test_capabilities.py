"""The worker consults ``backend.capabilities`` (backend/base.py) and opts out of what a backend lacks.
Each test runs the real worker on the real PostgreSQL backend with one capability switched off, as a
backend without it (MySQL: no server-side lease bounds, no LISTEN/NOTIFY) would declare:

- no server-side lease bounds: the lease sessions carry no idle/transaction timeout, and the
  worker's watchdog ends a lease held past ``lease_timeout``; its job is available again;
- no LISTEN/NOTIFY: no listener is started, the worker polls, and jobs still run;
- no batched claims: every claim takes one job (no two jobs share a transaction).
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

import skiplock
from skiplock.worker.batching import WholeBatches
from support import wait_for


def without(app: skiplock.App, **off: bool) -> None:
    """Switch capabilities off on the app's (real PostgreSQL) backend, before any session opens."""
    app.backend.capabilities = dataclasses.replace(app.backend.capabilities, **off)


@pytest.fixture
def short_lease_app(dsn):
    a = skiplock.App(dsn, lease_timeout=1)
    yield a
    a.close()


def test_without_server_lease_bounds_the_watchdog_ends_an_over_long_lease_and_the_job_runs_again(short_lease_app, db):
    app = short_lease_app
    without(app, server_bounds_lease=False)
    app.migrate()
    seen: list[tuple[int, str]] = []

    @app.task(name="slow", max_attempts=3, retry=0)
    def slow(job):
        timeout = job.conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
        seen.append((job.attempt, timeout))
        if job.attempt == 1:  # hold the lease until its session is gone (a safety net of 20 s)
            pid = job.conn.info.backend_pid
            wait_for(lambda: not db.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)",
                                            [pid]).fetchone()[0], 20, "the watchdog to end the lease")

    job_id = app.enqueue("slow")
    stats = app.worker(concurrency=1, handle_signals=False, poll_interval=0.05).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert seen == [(1, "0"), (2, "0")], seen  # no server-side bound on the lease sessions
    assert (job.state, job.attempts) == ("done", 2), job
    assert [e["attempt"] for e in job.errors] == [1], job.errors
    assert job.errors[0]["error"].startswith("LeaseTimeout"), job.errors[0]["error"][:200]
    assert stats.done == 1 and stats.retried == 1, stats


def test_without_listen_notify_the_worker_polls(app):
    without(app, listen_notify=False)
    app.migrate()
    ran = threading.Event()

    @app.task(name="ping")
    def ping(job):
        ran.set()

    worker = app.worker(concurrency=1, handle_signals=False, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert worker.started.wait(20)
        job_id = app.enqueue("ping")
        assert ran.wait(20), "the job ran (found by polling)"
        assert worker.listener is None  # no LISTEN session was started
        wait_for(lambda: app.get_job(job_id).state == "done", 20, "the job to be done")
    finally:
        worker.stop()
        thread.join(20)


def test_without_batched_claims_every_claim_takes_one_job(app):
    without(app, batched_claims=False)
    app.migrate()
    transactions: dict[int, int] = {}

    @app.task(name="fast")
    def fast(job):
        transactions[job.id] = job.conn.execute("SELECT txid_current()").fetchone()[0]

    ids = app.enqueue_many([("fast", {})] * 12)
    # WholeBatches claims batch_size jobs from the first claim on: with batched claims, jobs share a
    # transaction (see tests/integration/test_batches.py).
    app.worker(concurrency=1, handle_signals=False, batch_policy=WholeBatches(batch_size=6)).run(stop_when_empty=True)
    assert sorted(transactions) == sorted(ids)
    assert len(set(transactions.values())) == len(ids), transactions  # one transaction per job
    assert {app.get_job(i).state for i in ids} == {"done"}
