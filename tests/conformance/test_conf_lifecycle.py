"""Unique keys, pause, prune, retry and cron ticks (docs/guarantees.md and the App docstrings that
state them; the backend is what guarantees each)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from conformance_support import in_thread, new_job
from support import wait_for


def _finish(subject, job_id, state="done"):
    lease = subject.lease()
    claimed = subject.claim_one(lease)
    assert claimed.id == job_id
    if state == "done":
        assert subject.complete(lease, claimed, 1)
    else:
        assert subject.record(lease, claimed, 1, state) == state
    subject.commit(lease)


def test_a_unique_key_is_held_by_at_most_one_active_job_across_concurrent_enqueues(subject, backend):
    """Guarantee: "jobs_unique_key_idx allows one" queued or running job per key: two callers
    enqueueing the same key at once in their own transactions get one job; the second waits for the
    first's commit and is handed its id."""
    a, b = subject.producer(), subject.producer()
    first, created = backend.enqueue_unique(new_job(), "k", a)
    assert created
    second = in_thread(lambda: backend.enqueue_unique(new_job(), "k", b))
    wait_for(lambda: subject.waiting(b), what="the second enqueue to wait for the first's transaction")
    subject.commit(a)
    assert second() == (first, False)
    subject.commit(b)
    assert backend.unique_key_holder("k") == (first, "queued")


def test_a_unique_key_is_free_again_when_the_holder_rolls_back_or_finishes(subject, backend):
    """Guarantee: the key is held only by a queued or running job that exists (committed)."""
    a, b = subject.producer(), subject.producer()
    backend.enqueue_unique(new_job(), "k", a)
    second = in_thread(lambda: backend.enqueue_unique(new_job(), "k", b))
    wait_for(lambda: subject.waiting(b), what="the second enqueue to wait for the first's transaction")
    subject.rollback(a)
    winner, created = second()
    subject.commit(b)
    assert created and backend.unique_key_holder("k") == (winner, "queued")
    _finish(subject, winner)
    assert backend.unique_key_holder("k") is None
    assert backend.enqueue_unique(new_job(), "k")[1]


def test_a_running_claimed_job_holds_its_unique_key(subject, backend):
    """Guarantee: the key is held by a queued *or running* job: an enqueue meanwhile gets the holder."""
    holder, _ = backend.enqueue_unique(new_job(), "k")
    lease = subject.lease()
    backend.start_claimed(lease, subject.claim_one(lease), uuid.uuid4(), 60.0, "w/0")
    subject.commit(lease)
    assert backend.enqueue_unique(new_job(), "k") == (holder, False)
    assert backend.unique_key_holder("k") == (holder, "running")


def test_retrying_a_failed_job_whose_key_a_newer_job_holds_is_refused_and_reported(subject, backend):
    """Guarantee: "retrying failed jobs whose unique key is held by a newer job: retry_failed retries
    every other job and reports each held one (the holder's id); retry_job refuses"."""
    old, _ = backend.enqueue_unique(new_job(max_attempts=1), "k")
    _finish(subject, old, "failed")
    holder, _ = backend.enqueue_unique(new_job(), "k")
    other = backend.enqueue([new_job("other", queue="q2", max_attempts=1)])[0]
    lease = subject.lease()
    claimed = subject.claim_one(lease, ["q2"])
    assert subject.record(lease, claimed, 1, "failed") == "failed"
    subject.commit(lease)
    assert not backend.retry_job(old)
    assert backend.retry_failed(None) == [(old, "k", False, holder), (other, None, True, None)]
    assert (subject.state(old), subject.state(other)) == ("failed", "queued")


def test_retry_job_puts_a_failed_job_back_with_fresh_attempts_and_its_errors(subject, enqueue, backend):
    """Guarantee (App.retry_job): "a fresh set of attempts, its error history kept"."""
    job_id = enqueue(max_attempts=1)
    _finish(subject, job_id, "failed")
    assert backend.retry_job(job_id)
    job = subject.job(job_id)
    assert (job["state"], job["attempts"], len(job["errors"])) == ("queued", 0, 1)
    assert not backend.retry_job(job_id)  # queued: nothing to retry


def test_a_paused_queue_is_not_claimed_and_resume_makes_it_claimable(subject, enqueue, backend):
    """Guarantee (App.pause_queue): workers stop claiming from a paused queue at their next claim --
    whether they claim that queue, several, or every queue; resume lets them claim it again."""
    paused = enqueue(queue="p")
    other = enqueue(queue="o")
    backend.pause_queue("p")
    assert backend.paused_queues() == ["p"]
    lease = subject.lease()
    assert subject.claim(lease, ["p"]) == []
    assert [j.id for j in subject.claim(lease, ["p", "o"], limit=10)] == [other]
    subject.rollback(lease)
    assert [j.id for j in subject.claim(lease, None, limit=10)] == [other]
    subject.rollback(lease)
    assert backend.resume_queue("p") and not backend.resume_queue("p")
    assert [j.id for j in subject.claim(lease, None, limit=10)] == [paused, other]


def test_pausing_is_known_for_a_queue_with_no_jobs(backend):
    """Guarantee: queue_known says whether a queue has jobs or is paused (pause refuses unknown ones)."""
    assert not backend.queue_known("nothing")
    backend.pause_queue("nothing")
    assert backend.queue_known("nothing")


def test_prune_deletes_only_finished_jobs_older_than_the_retention(subject, enqueue, backend):
    """Guarantee (App.prune): "Delete finished jobs older than their state's retention"; queued and
    running jobs, and finished ones younger than the retention, are untouched."""
    old, young, queued = enqueue(), enqueue(), enqueue(queue="q")
    _finish(subject, old)
    _finish(subject, young)
    subject.age_finished(old, 7200)
    running = enqueue(queue="r")
    conn = subject.lease()
    claimed = subject.claim_one(conn, ["r"])
    subject.backend.start_claimed(conn, claimed, uuid.uuid4(), 60.0, "w/0")
    subject.commit(conn)
    assert backend.prune("done", 3600, 100) == 1
    assert backend.get_job(old) is None
    assert (subject.state(young), subject.state(queued), subject.state(running)) == ("done", "queued", "running")
    assert backend.prune("queued", 0, 100) == 0 and backend.prune("running", 0, 100) == 0
    assert subject.state(queued) == "queued" and subject.state(running) == "running"


def test_prune_never_waits_on_a_job_whose_transaction_lease_is_held(subject, enqueue, backend):
    """Guarantee (App.prune, the pruner): pruning deletes only finished rows and never waits on the
    row lock of a job a worker is running under the transaction lease -- it returns while that lease
    is still held (a pruner that scanned and waited would hold the worker's row hostage, or fail on
    the server's lock wait timeout)."""
    held = enqueue(queue="held")  # the lowest id: a scan from the start meets it first
    old = [enqueue() for _ in range(3)]
    for job_id in old:
        _finish(subject, job_id)
        subject.age_finished(job_id, 7200)
    lease = subject.lease()
    try:
        assert subject.claim_one(lease, ["held"]).id == held  # locked until this lease ends
        pruned = in_thread(lambda: backend.prune("done", 3600, 100))(60.0)
        assert pruned == 3
        assert [backend.get_job(j) for j in old] == [None, None, None]
    finally:
        subject.rollback(lease)
    assert subject.state(held) == "queued"


def test_a_cron_tick_is_enqueued_exactly_once(backend):
    """Guarantee (App.periodic): "Each tick is enqueued exactly once however many workers run
    schedulers"."""
    tick = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    job_id = backend.enqueue_tick("nightly", tick, new_job("n"))
    assert job_id is not None
    assert backend.enqueue_tick("nightly", tick, new_job("n")) is None
    assert backend.last_tick("nightly") == tick


def test_migrate_is_idempotent_and_the_schema_checks(backend):
    """Guarantee: "Apply pending migrations in order, each recorded; safe to run concurrently"."""
    assert backend.migrate() == []
    backend.check_schema()


def test_the_connection_budget_counts_the_sessions_open(subject, backend):
    """Guarantee: "worker with more slots than the server allows its connections refuses to start":
    connection_budget().available() says how many more sessions can be opened; one more lease, one less."""
    free, why = backend.connection_budget().available()
    assert free > 0 and why
    subject.lease()
    assert backend.connection_budget().available()[0] == free - 1
