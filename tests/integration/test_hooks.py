"""User hooks (skiplock.observability.hooks) on real workers against the real database: what fires,
when (after the COMMIT), with what, and that a raising or slow hook never touches a job."""

from __future__ import annotations

import logging
import threading

import pytest

import skiplock
from skiplock.observability import JobEvent

from support import wait_for


def record(app, *events):
    """Register a hook for each event that appends its JobEvent to a list (returned)."""
    seen: list[JobEvent] = []
    for name in events:
        app.on(name, seen.append)
    return seen


def state_of(db, job_id):
    return db.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()[0]


def test_success_is_reported_after_the_commit_with_the_jobs_identity(app, db):
    states = []

    @app.task(name="ok", queue="mail")
    def ok(job):
        job.conn.execute("SELECT 1")  # the handler touches the lease: its COMMIT is the job's

    # Seen from another session: the job's 'done' committed before the hook was called.
    app.on("success", lambda e: states.append(state_of(db, e.job_id)))
    seen = record(app, "enqueue", "start", "success")
    job_id = app.enqueue("ok")
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    assert states == ["done"]
    assert [(e.event, e.job_id, e.task, e.queue, e.attempt) for e in seen] == [
        ("enqueue", job_id, "ok", "mail", 0), ("start", job_id, "ok", "mail", 1), ("success", job_id, "ok", "mail", 1)]
    success = seen[-1]
    assert success.outcome == "done" and success.error is None and success.duration >= 0
    with pytest.raises(AttributeError):
        success.job_id = 1  # immutable


def test_each_failed_attempt_is_a_failure_and_the_last_one_is_dead_too(app):
    @app.task(name="boom", max_attempts=2, retry=0)
    def boom(job):
        raise ValueError("no such mailbox")

    seen = record(app, "failure", "dead", "success")
    job_id = app.enqueue("boom")
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    assert app.get_job(job_id).state == "failed"
    assert [(e.event, e.attempt, e.outcome) for e in seen] == [
        ("failure", 1, "retry"), ("failure", 2, "failed"), ("dead", 2, "failed")]
    assert all(e.error.startswith("ValueError: no such mailbox") for e in seen)


def test_every_job_of_a_batch_is_reported_once(app):
    @app.task(name="fast")
    def fast(job, n):
        return n

    seen = record(app, "success", "start")
    ids = app.enqueue_many([("fast", {"n": n}) for n in range(200)])
    stats = app.worker(concurrency=2, handle_signals=False, batch_size=32).run(stop_when_empty=True)
    assert stats.done == 200
    assert sorted(e.job_id for e in seen if e.event == "success") == ids
    assert sorted(e.job_id for e in seen if e.event == "start") == ids
    enqueued = record(app, "enqueue")
    more = app.enqueue_many([("fast", {"n": 1}), ("fast", {"n": 2})])
    app.hooks.drain()
    assert [e.job_id for e in enqueued] == more


def test_a_raising_hook_is_logged_once_and_never_breaks_a_job(app, caplog):
    @app.task(name="ok")
    def ok(job):
        job.conn.execute("SELECT 1")

    def bad(event):
        raise RuntimeError("hook bug")

    for name in ("start", "success"):
        app.on(name, bad)
    seen = record(app, "success")
    ids = [app.enqueue("ok") for _ in range(3)]
    with caplog.at_level(logging.ERROR, logger="skiplock.hooks"):
        stats = app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    assert stats.done == 3 and [app.get_job(i).state for i in ids] == ["done"] * 3
    assert sorted(e.job_id for e in seen) == ids  # the other hooks still ran
    logged = [r for r in caplog.records if r.name == "skiplock.hooks"]
    assert len(logged) == 1 and "hook bug" in logged[0].exc_text, [r.getMessage() for r in logged]
    assert app.hooks.raised == 6


def test_a_slow_hook_does_not_hold_the_lease(app, db):
    release = threading.Event()

    @app.task(name="ok")
    def ok(job):
        job.conn.execute("SELECT 1")

    app.on("start", lambda e: release.wait(30))
    job_id = app.enqueue("ok")
    worker = app.worker(concurrency=1, handle_signals=False)
    thread = threading.Thread(target=worker.run, kwargs={"stop_when_empty": True})
    thread.start()
    try:
        # The start hook is still blocked, yet the job ran and committed.
        wait_for(lambda: state_of(db, job_id) == "done", 30, "the job done while its start hook blocks")
        assert not release.is_set()
    finally:
        release.set()
        thread.join(30)
    assert not thread.is_alive()


def test_a_claimed_job_cancelled_while_it_runs_reports_lease_lost(app, db):
    running, go_on = threading.Event(), threading.Event()

    @app.task(name="long", lease="claimed", lease_seconds=30)
    def long(job):
        running.set()
        go_on.wait(30)

    seen = record(app, "lease_lost", "success", "cancel")
    job_id = app.enqueue("long")
    worker = app.worker(concurrency=1, handle_signals=False)
    thread = threading.Thread(target=worker.run, kwargs={"stop_when_empty": True})
    thread.start()
    try:
        assert running.wait(30)
        assert app.cancel_job(job_id, wait=0) == "cancelled"
    finally:
        go_on.set()
        thread.join(30)
    assert [(e.event, e.job_id, e.outcome) for e in seen] == [("lease_lost", job_id, "lease_lost")]


def test_hook_registration_checks_its_input():
    app = skiplock.App("postgresql:///unused")
    with pytest.raises(ValueError, match="unknown hook event 'succes'"):
        app.on("succes", print)
    with pytest.raises(TypeError):
        app.on("success", 42)

    @app.on("dead")
    def dead(event):
        pass

    assert app.hooks.wants("dead") and not app.hooks.wants("success")
