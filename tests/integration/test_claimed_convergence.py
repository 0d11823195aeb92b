"""Claimed-lease jobs always converge: when the server has closed the slot's idle connection while the
handler ran, the finishing write still happens (on a fresh connection, fenced on owner), and
``max_attempts`` bounds every path that puts a job back in the queue."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from psycopg import sql

from skiplock.maintenance.rescuer import Rescuer

from support import wait_for


@pytest.fixture
def runs(db):
    db.execute("CREATE TABLE runs (job_id bigint NOT NULL, attempt int NOT NULL)")
    return db


@pytest.fixture
def short_idle_sessions(db):
    """The server ends any session idle (outside a transaction) for more than 500 ms."""
    db.execute(sql.SQL("ALTER DATABASE {} SET idle_session_timeout = '500ms'").format(sql.Identifier(db.info.dbname)))


def _note_run(dsn, job):
    """Count a run on a connection of our own (a claimed-lease job's own writes could be lost)."""
    import psycopg
    with psycopg.connect(dsn, autocommit=True, options="-c idle_session_timeout=0") as c:
        c.execute("INSERT INTO runs VALUES (%s, %s)", [job.id, job.attempt])


def _until_finished(app, worker, job_id, timeout=30.0):
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        return wait_for(lambda: (j := app.get_job(job_id)).state in ("done", "failed") and j, timeout,
                        f"job {job_id} to end done or failed",
                        on_timeout=lambda: str(app.get_job(job_id)))
    finally:
        worker.stop()
        thread.join(30)


def test_a_job_outliving_its_idle_connection_ends_done_once(app, dsn, runs, short_idle_sessions):
    @app.task(name="outlives", lease="claimed", lease_seconds=30, max_attempts=3)
    def outlives(job):
        _note_run(dsn, job)
        time.sleep(1.5)  # the slot's connection, idle meanwhile, is ended by the server after 0.5 s
        return {"slept": 1.5}

    job_id = app.enqueue("outlives")
    worker = app.worker(concurrency=1, handle_signals=False, poll_interval=0.05, listen=False, maintenance=False)
    job = _until_finished(app, worker, job_id)
    assert (job.state, job.attempts, job.result) == ("done", 1, {"slept": 1.5}), job
    assert runs.execute("SELECT job_id, attempt FROM runs").fetchall() == [(job_id, 1)]
    assert worker.stats.done == 1 and worker.stats.lost == 0


def test_a_failing_job_outliving_its_idle_connection_fails_after_max_attempts(app, dsn, runs, short_idle_sessions):
    @app.task(name="outlives_and_fails", lease="claimed", lease_seconds=30, max_attempts=3, retry=0)
    def outlives_and_fails(job):
        _note_run(dsn, job)
        time.sleep(1.5)
        raise ValueError(f"boom on attempt {job.attempt}")

    job_id = app.enqueue("outlives_and_fails")
    worker = app.worker(concurrency=1, handle_signals=False, poll_interval=0.05, listen=False, maintenance=False)
    job = _until_finished(app, worker, job_id)
    assert (job.state, job.attempts) == ("failed", 3), job
    assert job.last_error.startswith("ValueError: boom on attempt 3"), job.last_error
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert runs.execute("SELECT attempt FROM runs ORDER BY attempt").fetchall() == [(1,), (2,), (3,)]


def test_writes_lost_with_the_connection_are_a_counted_failure_not_done(app, dsn, db, runs):
    """The handler wrote through job.conn, then its session was ended: those writes are gone, so the
    job is not done; the attempt is a failure, counted, and the job converges within max_attempts."""
    @app.task(name="writes_then_loses", lease="claimed", lease_seconds=30, max_attempts=2, retry=0)
    def writes_then_loses(job):
        _note_run(dsn, job)
        job.conn.execute("INSERT INTO runs VALUES (%s, -1)", [job.id])  # lost with the session
        db.execute("SELECT pg_terminate_backend(%s, 5000)", [job.conn.info.backend_pid])
        return "returned"

    job_id = app.enqueue("writes_then_loses")
    worker = app.worker(concurrency=1, handle_signals=False, poll_interval=0.05, listen=False, maintenance=False)
    job = _until_finished(app, worker, job_id)
    assert (job.state, job.attempts) == ("failed", 2), job
    assert "connection was lost" in job.last_error, job.last_error
    assert runs.execute("SELECT attempt FROM runs ORDER BY attempt").fetchall() == [(1,), (2,)]


def test_a_claimed_job_queued_with_its_attempts_used_up_fails_without_running(app, db, runs):
    """Whatever put it back (an older version's unbounded retry, a manual update), a claimed-lease job
    with no attempt left is not run again."""
    ran = []

    @app.task(name="spent", lease="claimed", max_attempts=3)
    def spent(job):
        ran.append(job.attempt)

    job_id = app.enqueue("spent")
    db.execute("UPDATE skiplock.jobs SET attempts = 10 WHERE id = %s", [job_id])
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert ran == []
    assert (job.state, job.attempts) == ("failed", 10), job
    assert "attempt" in job.last_error and "max_attempts 3" in job.last_error, job.last_error


def test_the_rescuer_requeues_only_while_attempts_remain(app, db):
    ids = app.enqueue_many([("x", {}, {"max_attempts": 2})] * 2)
    # both running with an expired lease: one after its first attempt, one after its last
    for job_id, attempts in zip(ids, (1, 2)):
        db.execute("UPDATE skiplock.jobs SET state = 'running', owner = %s, attempts = %s, "
                   "lease_expires_at = now() - interval '1 second' WHERE id = %s", [uuid.uuid4(), attempts, job_id])
    Rescuer(app).step()
    assert [(app.get_job(i).state, app.get_job(i).attempts) for i in ids] == [("queued", 1), ("failed", 2)]
