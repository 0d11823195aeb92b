"""The Prometheus metrics a running worker moves besides the job counters (issue 13 §2): worker slots
busy and jobs in flight while a handler runs, the oldest ready job's age per queue (sampled), lease
losses and rescues of a claimed-lease job, and reconnects after the server ended the worker's
sessions. Real workers on the test database; read from the App's registry as Prometheus would."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import psycopg

from test_metrics import parse, value

from support import wait_for


def scrape(metrics):
    return parse(metrics.exposition().decode())


def start(worker):
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_busy_slots_in_flight_and_the_oldest_ready_age(app):
    metrics = app.enable_metrics()
    gate, started = threading.Event(), threading.Event()

    @app.task(name="hold", queue="work")
    def hold(job):
        started.set()
        gate.wait(60)

    worker = app.worker(queues=["work"], concurrency=2, poll_interval=0.05, handle_signals=False)
    thread = start(worker)
    try:
        app.enqueue("hold")
        assert started.wait(30)
        samples = scrape(metrics)
        assert value(samples, "skiplock_worker_slots") == 2
        assert value(samples, "skiplock_worker_slots_busy") == 1
        # the lease governor: two slots, both allowed a lease; the busy one holds a permit
        assert value(samples, "skiplock_worker_lease_limit") == 2
        assert 1 <= value(samples, "skiplock_worker_leases_held") <= 2
        assert value(samples, "skiplock_worker_lease_limit_changes_total") == worker.governor.changes
        assert value(samples, "skiplock_jobs_in_flight") == 1
        # a queue no worker serves: its oldest ready job is two minutes old (sampled, not per scrape)
        app.enqueue("nobody_runs_this", queue="idle", run_at=datetime.now(timezone.utc) - timedelta(minutes=2))
        metrics.sample()
        assert 120 <= value(scrape(metrics), "skiplock_queue_oldest_ready_age_seconds", queue="idle") < 3600
    finally:
        gate.set()
        worker.stop()
        thread.join(30)
    samples = scrape(metrics)
    assert value(samples, "skiplock_worker_slots_busy") == 0 and value(samples, "skiplock_jobs_in_flight") == 0


def test_a_rescue_and_the_lease_loss_it_causes_are_counted(app, db):
    metrics = app.enable_metrics()
    release, runs = threading.Event(), []

    @app.task(name="paused", lease="claimed", lease_seconds=60, max_attempts=3)
    def paused(job):
        runs.append(job.attempt)
        if job.attempt == 1:
            release.wait(30)  # as if its worker were paused past its lease
        return job.attempt

    job_id = app.enqueue("paused")
    first = app.worker(concurrency=1, poll_interval=0.02, handle_signals=False, maintenance=False)
    thread = start(first)
    try:
        wait_for(lambda: runs == [1], 30, "attempt 1 running")
        first.stop()  # claims nothing more; attempt 1 is still in its handler
        [s for s in first.services if s.name == "heartbeat"][0].stop()
        db.execute("UPDATE skiplock.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job_id])
        # a second worker's rescuer returns the expired job to the queue, then runs attempt 2
        second = app.worker(concurrency=1, poll_interval=0.02, handle_signals=False, rescue_interval=0.1)
        second_thread = start(second)
        try:
            wait_for(lambda: app.get_job(job_id).state == "done", 30, "attempt 2 done")
            assert value(scrape(metrics), "skiplock_rescues_total") == 1
        finally:
            second.stop()
            second_thread.join(30)
        release.set()  # attempt 1 finishes now: its fenced write is refused, a lease loss
    finally:
        release.set()
        thread.join(30)
    samples = scrape(metrics)
    assert value(samples, "skiplock_lease_losses_total") == 1
    assert value(samples, "skiplock_rescues_total") == 1  # kept after both workers stopped
    assert app.get_job(job_id).result == 2


def test_reconnects_after_the_server_ends_the_workers_sessions(app, dsn):
    metrics = app.enable_metrics()

    @app.task(name="ok")
    def ok(job):
        return 1

    worker = app.worker(concurrency=1, poll_interval=0.05, handle_signals=False)
    thread = start(worker)
    try:
        first = app.enqueue("ok")
        wait_for(lambda: app.get_job(first).state == "done", 30, "the first job done")
        assert value(scrape(metrics), "skiplock_reconnects_total") == 0
        with psycopg.connect(dsn, autocommit=True) as c:
            ended = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]
        assert ended >= 1
        wait_for(lambda: (value(scrape(metrics), "skiplock_reconnects_total") or 0) >= 1, 30, "a reconnect counted")
        second = app.enqueue("ok")  # the worker runs jobs again on its new session
        wait_for(lambda: app.get_job(second).state == "done", 30, "a job done after the reconnect")
    finally:
        worker.stop()
        thread.join(30)
