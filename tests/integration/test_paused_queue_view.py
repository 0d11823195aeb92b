"""A worker of every queue names the queues with jobs while one is paused (worker/queue_view.py):
its claims walk only those queues' jobs, never the paused backlog, and it still finds a queue that
gets its first jobs, or is resumed, meanwhile."""

from __future__ import annotations

import threading

import pytest

from skiplock.backend.postgres.queries import MERGED_QUEUES_MAX
from skiplock.worker import queue_view
from test_worker import wait_for


def noop(job) -> None:
    pass


@pytest.fixture
def named_claims(app):
    """(the ``queues`` argument, jobs claimed) of every claim the backend runs, in order."""
    seen: list = []
    claim = app.backend.claim

    def counted(conn, queues, *args, **kwargs):
        got = claim(conn, queues, *args, **kwargs)
        seen.append((None if queues is None else list(queues), len(got)))
        return got
    app.backend.claim = counted
    return seen


def running(worker):
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.started.wait(10)
    return thread


def test_claimable_queues_are_read_only_while_a_queue_is_paused(app, db):
    app.task(name="noop")(noop)
    for queue, n in (("b", 3), ("a", 2), ("p", 5)):
        app.enqueue_many([("noop", {}, {"queue": queue})] * n)
    db.execute("UPDATE skiplock.jobs SET state = 'done', finished_at = now() WHERE queue = 'a'")
    app.enqueue("noop", queue="a")
    assert app.backend.claimable_queues(db, 16) == ([], [])  # nothing paused: no scan
    app.pause_queue("p")
    assert app.backend.claimable_queues(db, 16) == (["p"], ["a", "b", "p"])
    db.execute("UPDATE skiplock.jobs SET state = 'done', finished_at = now() WHERE queue = 'b'")  # done jobs: not queued
    assert app.backend.claimable_queues(db, 16) == (["p"], ["a", "p"])
    for i in range(5):
        app.enqueue("noop", queue=f"q{i}")
    assert app.backend.claimable_queues(db, 3) == (["p"], ["a", "p", "q0", "q1"])  # stops past `most`


def test_the_view_names_as_many_queues_as_the_merged_claim_takes():
    assert queue_view.MOST_NAMED == MERGED_QUEUES_MAX


def test_a_worker_of_every_queue_names_the_unpaused_queues_and_runs_nothing_paused(app, named_claims):
    app.task(name="noop")(noop)
    app.enqueue_many([("noop", {}, {"queue": "other"})] * 300)
    app.pause_queue("other")
    ids = app.enqueue_many([("noop", {})] * 50) + app.enqueue_many([("noop", {}, {"queue": "x"})] * 50)
    worker = app.worker(concurrency=2, handle_signals=False, maintenance=False)
    stats = worker.run(stop_when_empty=True)
    assert stats.done == 100
    assert {app.get_job(i).state for i in ids} == {"done"}
    assert {q: n for q, s, n in app.counts() if q == "other"} == {"other": 300}
    named = [q for q, _ in named_claims if q is not None]
    assert ["default", "x"] in named, named_claims
    assert all(q and set(q) <= {"default", "x"} for q in named), named_claims  # never the paused queue
    # every claim that found jobs named the queues, but for the slots' first ones, which may run before
    # the first read of the view is done (one slot reads it; the other claims every queue meanwhile)
    assert sum(1 for q, n in named_claims if q is None and n) <= 2, named_claims
    assert worker.queue_view is not None and worker.queue_view.reads >= 1


def test_with_nothing_paused_the_claim_is_of_every_queue(app, named_claims):
    app.task(name="noop")(noop)
    app.enqueue_many([("noop", {})] * 20)
    app.enqueue_many([("noop", {}, {"queue": "x"})] * 20)
    assert app.worker(concurrency=2, handle_signals=False, maintenance=False).run(stop_when_empty=True).done == 40
    assert named_claims and all(q is None for q, _ in named_claims)


def test_a_queue_that_gets_its_first_job_while_another_is_paused_is_claimed_at_once(app, monkeypatch):
    """The view is not read again for an hour here and the worker polls once a minute: only the read
    after an empty claim of the named queues can find the new queue's job (its NOTIFY wakes the idle
    slot, whose claim of the named queue -- its one job running on the other slot -- comes back empty)."""
    monkeypatch.setattr(queue_view, "REFRESH_SECONDS", 3600.0)
    release = threading.Event()
    started = threading.Event()

    def block(job) -> None:
        started.set()
        release.wait(30)
    app.task(name="noop")(noop)
    app.task(name="block")(block)
    paused = app.enqueue_many([("noop", {}, {"queue": "other"})] * 100)
    app.pause_queue("other")
    blocker = app.enqueue("block", queue="slow")
    worker = app.worker(concurrency=2, poll_interval=60, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        assert started.wait(20)
        wait_for(lambda: worker._sleeping == 1)  # the other slot found nothing more and sleeps
        assert worker.queue_view.named == ["slow"]
        reads = worker.queue_view.reads
        job = app.enqueue("noop", queue="fresh")
        wait_for(lambda: app.get_job(job).state == "done", timeout=20)
        assert worker.queue_view.reads > reads
        assert app.get_job(blocker).state == "running"
        release.set()
        wait_for(lambda: app.get_job(blocker).state == "done", timeout=20)
        assert {app.get_job(i).state for i in paused} == {"queued"}
    finally:
        release.set()
        worker.stop()
        thread.join(30)


def test_a_resumed_queue_is_claimed_from_again(app):
    app.task(name="noop")(noop)
    held = app.enqueue_many([("noop", {}, {"queue": "other"})] * 30)
    app.pause_queue("other")
    worker = app.worker(concurrency=2, poll_interval=0.2, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        job = app.enqueue("noop")
        wait_for(lambda: app.get_job(job).state == "done", timeout=20)
        assert {app.get_job(i).state for i in held} == {"queued"}
        app.resume_queue("other")
        wait_for(lambda: {app.get_job(i).state for i in held} == {"done"}, timeout=20)
    finally:
        worker.stop()
        thread.join(30)
