"""LISTEN/NOTIFY wake-ups (a hint, recovered by polling) and batched claims (still exactly once)."""

from __future__ import annotations

import threading

import pytest

from test_worker import record, wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, slot text NOT NULL)")
    return db


def running(worker):
    thread = threading.Thread(target=worker.run)
    thread.start()
    worker.started.wait(10)
    return thread


def test_notify_wakes_an_idle_worker_long_before_its_poll(app, effects):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=2, poll_interval=60, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        assert worker.listener.listening.wait(10)
        wait_for(lambda: len(worker._leases) == 2)  # both slots connected, polled once, now idle for 60 s
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done", timeout=20)  # poll interval is 60 s
        assert worker.listener.notifications >= 1
    finally:
        worker.stop()
        thread.join(30)


def test_without_notify_polling_still_finds_jobs(app, effects):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False, listen=False)
    thread = running(worker)
    try:
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done")
        assert worker.listener is None
    finally:
        worker.stop()
        thread.join(30)


def test_a_killed_listener_reconnects_and_relistens(app, effects, db):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=1, poll_interval=60, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        listeners = "SELECT pid FROM pg_stat_activity WHERE application_name = 'skiplock-listener' AND datname = current_database()"
        wait_for(lambda: db.execute(listeners).fetchall())
        db.execute(f"SELECT pg_terminate_backend(pid) FROM ({listeners}) l")
        wait_for(lambda: worker.listener.reconnects >= 1)
        wait_for(lambda: db.execute(listeners).fetchall())
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done", timeout=20)
    finally:
        worker.stop()
        thread.join(30)


def test_batched_claims_drain_exactly_once(app, effects):
    app.task(name="effect")(record)
    ids = app.enqueue_many([("effect", {})] * 1000)
    stats = app.worker(concurrency=4, batch_size=20, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert stats.done == 1000
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id").fetchall())
    assert per_job == {i: 1 for i in ids}

