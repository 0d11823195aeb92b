"""The worker in-process: exactly-once database-local effects, failures, timeouts, reconnects, abort."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

import skiplock


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, slot text NOT NULL)")
    return db


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def record(job) -> None:
    job.conn.execute("INSERT INTO effects VALUES (%s, %s)", [job.id, job.worker])


def test_threads_drain_2000_jobs_each_effect_exactly_once(app, effects):
    @app.task(name="effect")
    def effect(job, n):
        record(job)

    ids = app.enqueue_many([("effect", {"n": i}) for i in range(2000)])
    stats = app.worker(concurrency=8).run(stop_when_empty=True)
    assert stats.done == 2000 and stats.failed == 0
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id").fetchall())
    assert per_job == {i: 1 for i in ids}
    assert effects.execute("SELECT count(DISTINCT slot) FROM effects").fetchone()[0] > 1  # really concurrent
    assert effects.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done' OR attempts <> 1").fetchone()[0] == 0
    assert effects.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_two_worker_objects_share_the_queue_through_skip_locked(dsn, effects):
    apps = [skiplock.App(dsn) for _ in range(2)]
    for a in apps:
        a.task(name="effect")(lambda job: record(job))
    ids = apps[0].enqueue_many([("effect", {})] * 600)
    workers = [a.worker(concurrency=3, handle_signals=False) for a in apps]
    threads = [threading.Thread(target=w.run, kwargs={"stop_when_empty": True}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(w.stats.done for w in workers) == 600
    assert all(w.stats.done > 0 for w in workers)
    assert effects.execute("SELECT count(*), count(DISTINCT job_id) FROM effects").fetchone() == (600, 600)
    assert set(ids) == {r[0] for r in effects.execute("SELECT job_id FROM effects")}
    for a in apps:
        a.close()


def test_a_failing_handler_is_rolled_back_retried_then_failed_with_its_reasons(app, effects):
    @app.task(name="flaky", max_attempts=3, retry=0)
    def flaky(job):
        record(job)
        raise ValueError(f"boom on attempt {job.attempt}")

    job_id = app.enqueue("flaky")
    stats = app.worker(concurrency=1).run(stop_when_empty=True)
    assert (stats.done, stats.retried, stats.failed) == (0, 2, 1)
    job = app.get_job(job_id)
    assert job.state == "failed" and job.attempts == 3 and job.finished_at is not None
    assert job.last_error.startswith("ValueError: boom on attempt 3")
    assert "Traceback" in job.last_error and "in flaky" in job.last_error
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0  # every attempt rolled back


def test_after_a_failure_the_job_is_queued_with_backoff_and_the_error_recorded(app, effects):
    @app.task(name="once", max_attempts=5, retry=3600)
    def once(job):
        record(job)
        raise RuntimeError("not yet")

    job_id = app.enqueue("once")
    app.worker(concurrency=1).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert job.state == "queued" and job.attempts == 1
    assert job.last_error.startswith("RuntimeError: not yet")
    assert job.run_at.timestamp() > time.time() + 3000  # the retry waits for its backoff
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0


def test_unknown_task_ends_failed_once_with_a_clear_reason_with_fail_unknown_tasks(app):
    """The opt-in old behaviour (by default a worker never claims a task it does not know:
    tests/integration/test_known_tasks.py)."""
    job_id = app.enqueue("no.such.task", {"x": 1})
    stats = app.worker(concurrency=1, fail_unknown_tasks=True).run(stop_when_empty=True)
    assert stats.failed == 1
    job = app.get_job(job_id)
    assert job.state == "failed" and job.attempts == 1
    assert "unknown task 'no.such.task'" in job.last_error
    assert job.args == {"x": 1}  # kept, not lost


def test_handler_ending_the_transaction_itself_is_a_failure(app, effects):
    @app.task(name="rude", max_attempts=1)
    def rude(job):
        record(job)
        job.conn.commit()

    job_id = app.enqueue("rude")
    app.worker(concurrency=1).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert job.state == "failed" and "ended the job's transaction" in job.last_error


def test_result_is_stored_and_a_non_json_result_fails_the_attempt(app):
    @app.task(name="answer")
    def answer(job, x):
        return {"double": 2 * x}

    @app.task(name="weird", max_attempts=1)
    def weird(job):
        return {1, 2}

    ok, bad = app.enqueue("answer", {"x": 21}), app.enqueue("weird")
    app.worker(concurrency=1).run(stop_when_empty=True)
    assert app.get_job(ok).result == {"double": 42}
    assert "not JSON-serialisable" in app.get_job(bad).last_error


def test_a_lease_held_past_lease_timeout_is_ended_by_the_server(dsn, effects):
    app = skiplock.App(dsn, lease_timeout=1)

    @app.task(name="slow", max_attempts=1)
    def slow(job):
        record(job)
        time.sleep(2.5)  # idle in transaction past the bound: the server ends the session
        job.conn.execute("SELECT 1")

    job_id = app.enqueue("slow")
    app.worker(concurrency=1).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert job.state == "failed"
    assert "timeout" in job.last_error.lower() or "terminat" in job.last_error.lower(), job.last_error
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    app.close()


def test_worker_reconnects_after_its_sessions_are_killed(app, effects, db):
    @app.task(name="effect")
    def effect(job):
        record(job)

    worker = app.worker(concurrency=2, poll_interval=0.05, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        worker.started.wait(10)
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                                    "'skiplock-worker%%' AND datname = current_database()").fetchone()[0] == 2)
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE "
                   "'skiplock-worker%%' AND datname = current_database()")
        ids = app.enqueue_many([("effect", {})] * 20)
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0] == 20)
    finally:
        worker.stop()
        thread.join(30)
    assert worker.stats.reconnects >= 1
    assert sorted(r[0] for r in effects.execute("SELECT job_id FROM effects")) == ids


def test_abort_rolls_back_in_flight_jobs_and_keeps_them_queued(app, effects, db):
    started = threading.Event()

    @app.task(name="long")
    def long(job):
        record(job)
        started.set()
        for _ in range(600):
            job.conn.execute("SELECT pg_sleep(0.05)")

    job_id = app.enqueue("long")
    worker = app.worker(concurrency=1, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(20)
    worker.stop(abort=True)
    thread.join(30)
    assert not thread.is_alive()
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    assert app.get_job(job_id).state == "queued"


def test_hostile_queue_name_is_stored_and_claimed_as_data(app, effects):
    queue = "q'; DROP TABLE skiplock.jobs; --\"\\"

    @app.task(name="effect", queue=queue)
    def effect(job):
        record(job)

    job_id = app.enqueue("effect")
    other = app.enqueue("effect", queue="default")
    app.worker(queues=[queue], concurrency=1).run(stop_when_empty=True)
    assert app.get_job(job_id).queue == queue and app.get_job(job_id).state == "done"
    assert app.get_job(other).state == "queued"


def test_bad_worker_options_are_refused(app):
    with pytest.raises(ValueError, match="concurrency"):
        app.worker(concurrency=0)
    with pytest.raises(ValueError, match="queues"):
        app.worker(queues=[""])


@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_handler_sees_its_job_running_whether_it_runs_alone_or_in_a_batch(app, batch_size):
    """Issue 11: under the transaction lease the row says 'queued' while it runs (its lock is the lease),
    but the Job the handler gets says what it is: running."""
    seen = []

    @app.task(name="look")
    def look(job):
        seen.append(job.state.value)

    app.enqueue_many([("look", {})] * 20)
    app.worker(concurrency=1, batch_size=batch_size, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert seen == ["running"] * 20
