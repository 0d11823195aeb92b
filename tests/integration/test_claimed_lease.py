"""The claimed lease: running state with owner and lease, heartbeats, rescue, fenced finishing writes."""

from __future__ import annotations

import threading
import time

import pytest

from skiplock.maintenance.rescuer import Rescuer

from test_worker import wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, attempt int NOT NULL)")
    return db


def write_effect(job):
    job.conn.execute("INSERT INTO effects VALUES (%s, %s)", [job.id, job.attempt])


def start(worker):
    thread = threading.Thread(target=worker.run)
    thread.start()
    return thread


def test_claimed_job_is_running_with_owner_lease_and_a_committed_attempt(app, effects, db):
    seen = {}

    @app.task(name="long", lease="claimed", lease_seconds=30)
    def long(job):
        # another session sees the claim committed: running, owned, leased, attempt counted
        seen["row"] = db.execute("SELECT state, owner IS NOT NULL, lease_expires_at > now(), attempts "
                                 "FROM skiplock.jobs WHERE id = %s", [job.id]).fetchone()
        write_effect(job)
        return "ok"

    job_id = app.enqueue("long")
    stats = app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    assert seen["row"] == ("running", True, True, 1)
    job = app.get_job(job_id)
    assert (job.state, job.result, job.attempts, job.lease_expires_at) == ("done", "ok", 1, None)
    assert stats.done == 1
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 1


def test_heartbeats_keep_a_blocked_handler_leased(app, effects):
    @app.task(name="sleepy", lease="claimed", lease_seconds=1)
    def sleepy(job):
        time.sleep(3.5)  # a blocking call, three times the lease
        write_effect(job)

    job_id = app.enqueue("sleepy")
    worker = app.worker(concurrency=1, handle_signals=False, rescue_interval=0.2)
    stats = worker.run(stop_when_empty=True)
    assert stats.done == 1 and stats.lost == 0
    assert app.get_job(job_id).attempts == 1
    assert [s for s in worker.services if isinstance(s, Rescuer)][0].rescued == []


def test_a_rescued_job_runs_again_and_the_stale_finishing_write_is_refused(app, effects, db):
    release = threading.Event()
    runs = []

    @app.task(name="paused", lease="claimed", lease_seconds=60, max_attempts=3)
    def paused(job):
        runs.append(job.attempt)
        write_effect(job)
        if job.attempt == 1:
            release.wait(30)  # as if the worker were paused past its lease
        return job.attempt

    job_id = app.enqueue("paused")
    first = app.worker(concurrency=1, poll_interval=0.02, handle_signals=False, maintenance=False)
    thread = start(first)
    try:
        wait_for(lambda: runs == [1])
        first.stop()  # claim nothing more; the stale attempt is still "running" in its handler
        # its lease expires (heartbeat stopped renewing it: simulate by expiring it) and is rescued
        first_hb = [s for s in first.services if s.name == "heartbeat"][0]
        first_hb.stop()
        db.execute("UPDATE skiplock.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job_id])
        assert app.backend.rescue_expired() == [(job_id, "queued")]
        second = app.worker(concurrency=1, handle_signals=False, maintenance=False)
        assert second.run(stop_when_empty=True).done == 1  # attempt 2 runs and finishes
        release.set()  # the stale attempt finishes now: its fenced write must be refused
    finally:
        release.set()
        thread.join(30)
    assert first.stats.lost == 1 and first.stats.done == 0
    job = app.get_job(job_id)
    assert (job.state, job.result, job.attempts) == ("done", 2, 2)
    assert effects.execute("SELECT attempt FROM effects").fetchall() == [(2,)]  # stale writes rolled back


def test_expired_lease_on_the_last_attempt_fails_with_the_reason(app, db):
    job_id = app.enqueue("whatever", max_attempts=1)
    db.execute("UPDATE skiplock.jobs SET state = 'running', owner = gen_random_uuid(), attempts = 1, "
               "lease_expires_at = now() - interval '1 minute', worker = 'gone:1/0' WHERE id = %s", [job_id])
    assert app.backend.rescue_expired() == [(job_id, "failed")]
    job = app.get_job(job_id)
    assert job.state == "failed" and job.last_error.startswith("lease expired")


def test_claimed_failure_is_retried_and_cancel_of_a_running_claimed_job(app, effects):
    started = threading.Event()

    @app.task(name="flaky", lease="claimed", max_attempts=2, retry=0)
    def flaky(job):
        write_effect(job)
        if job.attempt == 1:
            raise ValueError("first try fails")

    @app.task(name="forever", lease="claimed")
    def forever(job):
        started.set()
        time.sleep(2)
        write_effect(job)

    flaky_id = app.enqueue("flaky")
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    job = app.get_job(flaky_id)
    assert job.state == "done" and job.attempts == 2 and "first try fails" in job.errors[0]["error"]
    assert effects.execute("SELECT attempt FROM effects").fetchall() == [(2,)]

    forever_id = app.enqueue("forever")
    worker = app.worker(concurrency=1, handle_signals=False, poll_interval=0.02)
    thread = start(worker)
    try:
        assert started.wait(20)
        assert app.cancel_job(forever_id) == "cancelled"
    finally:
        worker.stop()
        thread.join(30)
    assert app.get_job(forever_id).state == "cancelled"
    assert worker.stats.lost == 1  # its finishing write was refused
    assert effects.execute("SELECT count(*) FROM effects WHERE job_id = %s", [forever_id]).fetchone()[0] == 0
