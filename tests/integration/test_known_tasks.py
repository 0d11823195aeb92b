"""A worker claims only the tasks registered in its app: another app's jobs (or a newer release's,
during a rolling deploy) stay queued, untouched, and are listed as jobs no running worker can take."""

from __future__ import annotations

import threading

import pytest

import skiplock
from support import wait_for


def two_apps(dsn: str) -> tuple[skiplock.App, skiplock.App]:
    a, b = skiplock.App(dsn), skiplock.App(dsn)

    @a.task(name="a.work")
    def a_work(job):
        return "a"

    @b.task(name="b.work")
    def b_work(job):
        return "b"

    return a, b


@pytest.fixture
def apps(dsn):
    a, b = two_apps(dsn)
    yield a, b
    a.close()
    b.close()


def test_a_worker_leaves_another_apps_jobs_queued_untouched(apps, db):
    a, b = apps
    b_ids = b.enqueue_many([("b.work", {})] * 3)  # ahead of A's jobs in the claim order
    a_ids = a.enqueue_many([("a.work", {})] * 3)
    stats = a.worker(concurrency=2).run(stop_when_empty=True)  # every queue, the default
    assert stats.done == 3 and stats.failed == 0
    assert {a.get_job(i).state.value for i in a_ids} == {"done"}
    for i in b_ids:
        job = b.get_job(i)
        assert (job.state.value, job.attempts, job.last_error, job.worker) == ("queued", 0, None, None)
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0
    b.worker(concurrency=1).run(stop_when_empty=True)  # a worker that knows them runs them
    assert {b.get_job(i).state.value for i in b_ids} == {"done"}


def test_with_queues_too_a_worker_claims_only_its_tasks(apps):
    a, b = apps
    for queues in (["default"], ["default", "other"]):
        b_id, a_id = b.enqueue("b.work"), a.enqueue("a.work")
        a.worker(queues=queues, concurrency=1).run(stop_when_empty=True)
        assert (a.get_job(a_id).state.value, b.get_job(b_id).state.value) == ("done", "queued")
        assert b.get_job(b_id).attempts == 0


def test_fail_unknown_tasks_is_the_old_behaviour_on_request(apps):
    a, b = apps
    b_id = b.enqueue("b.work", {"x": 1})
    stats = a.worker(concurrency=1, fail_unknown_tasks=True).run(stop_when_empty=True)
    assert stats.failed == 1
    job = b.get_job(b_id)
    assert job.state.value == "failed" and "unknown task 'b.work'" in job.last_error and job.args == {"x": 1}


def test_untakeable_jobs_are_those_no_live_worker_serving_their_queue_has_the_task_of(apps, db):
    from skiplock.worker.presence import LIVE_SECONDS

    a, b = apps
    a.enqueue("a.work", delay=3600)  # queued, due later
    a.enqueue("a.work", queue="mail")
    b.enqueue_many([("b.work", {})] * 2)
    # no worker runs: nothing can be taken
    assert a.untakeable_jobs() == [("default", "a.work", 1), ("default", "b.work", 2), ("mail", "a.work", 1)]

    @a.task(name="a.block")
    def block(job):
        release.wait(30)

    release = threading.Event()
    blocker = a.enqueue("a.block")
    worker = a.worker(queues=["default"], concurrency=1, handle_signals=False, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: a.get_job(blocker).attempts == 1, what="the worker to run the blocking job")
        # A serves 'default' with its tasks: B's jobs there and A's job in 'mail' cannot be taken
        assert a.untakeable_jobs() == [("default", "b.work", 2), ("mail", "a.work", 1)]
        row = db.execute("SELECT name, tasks, queues FROM skiplock.workers").fetchall()
        assert row == [(worker.name, ["a.block", "a.work"], ["default"])]
        # a worker that stopped refreshing its row no longer counts
        db.execute("UPDATE skiplock.workers SET last_seen = now() - %s * interval '1 second'", [LIVE_SECONDS + 1])
        assert ("default", "a.work", 1) in a.untakeable_jobs()  # the delayed one
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert db.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0] == 0  # deleted at exit


def test_rows_of_workers_that_died_without_a_word_are_deleted_after_an_hour(app, db):
    db.execute("INSERT INTO skiplock.workers (id, name, tasks, last_seen) VALUES "
               "(gen_random_uuid(), 'killed:1', '{a}', now() - interval '61 minutes'), "
               "(gen_random_uuid(), 'stalled:2', '{a}', now() - interval '59 minutes')")
    app.worker(concurrency=1).run(stop_when_empty=True)
    assert [r[0] for r in db.execute("SELECT name FROM skiplock.workers")] == ["stalled:2"]
