"""The read model (docs/guarantees.md, "What is running now"): the backend answers "what runs now,
and who runs it" with its read verbs."""

from __future__ import annotations

import uuid

from conformance_support import WORKER


def _in_flight(subject, enqueue):
    job_id = enqueue()
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim_one(lease)
    attempt = subject.start_attempt(book, lease, claimed)[0]
    return job_id, lease, claimed, attempt


def _running_ids(backend):
    return [r[0] for r in backend.running_now(None, 100)]


def test_a_transaction_lease_job_in_flight_shows_running_everywhere(subject, enqueue, backend):
    """Guarantee: "A job in flight shows running, whichever its lease, in running_now(), get_job,
    list_jobs, counts", with its worker, slot and attempt; not queued."""
    job_id, lease, claimed, attempt = _in_flight(subject, enqueue)
    assert subject.state(job_id) == "running"
    (row,) = backend.running_now(None, 100)
    assert row[:8] == (job_id, "default", "t", "transaction", 1, 3, WORKER.rsplit("/", 1)[0], 0)
    assert [j["id"] for j in backend.list_jobs(state="running", queue=None, task=None, limit=10)] == [job_id]
    assert backend.list_jobs(state="queued", queue=None, task=None, limit=10) == []
    assert backend.counts() == [("default", "running", 1)]


def test_a_killed_lease_is_no_longer_shown_running(subject, enqueue, backend):
    """Guarantee: "its worker is SIGKILLed: no longer running anywhere; queued again"."""
    job_id, lease, claimed, attempt = _in_flight(subject, enqueue)
    subject.kill(lease)
    assert subject.state(job_id) == "queued"
    assert _running_ids(backend) == []


def test_an_attempt_whose_outcome_is_pending_is_not_shown_running(subject, enqueue, backend):
    """Guarantee: "an unfinished attempt ... whose outcome is pending: not running"."""
    job_id, lease, claimed, attempt = _in_flight(subject, enqueue)
    assert subject.record(None, claimed, attempt, "queued", delay=0) is None  # pending: its row is locked
    assert _running_ids(backend) == []
    assert subject.job(job_id)["last_error"] == "E: boom"


def test_a_claimed_lease_job_shows_running_with_its_expiry(subject, enqueue, backend):
    """Guarantee: "a claimed-lease job runs: running, with lease_expires_at"."""
    job_id = enqueue()
    lease = subject.lease()
    claimed = subject.claim_one(lease)
    backend.start_claimed(lease, claimed, uuid.uuid4(), 60.0, WORKER)
    subject.commit(lease)
    (row,) = backend.running_now(None, 100)
    assert (row[0], row[3], row[4]) == (job_id, "claimed", 1) and row[9] is not None


def test_the_jobs_of_a_batch_are_not_shown_running_the_batch_is(subject, enqueue, backend):
    """Guarantee: "jobs of a batch in flight: none shown running; the batch shown with the jobs it
    holds"."""
    for _ in range(3):
        enqueue()
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim(lease, limit=3)
    batch, _, _ = backend.start_batch(book, claimed, WORKER, subject.session(lease))
    assert _running_ids(backend) == []
    ((batch_id, worker, slot, _, held),) = backend.batches_in_flight(None, 10)
    assert (batch_id, slot, held) == (batch, 0, 3)
    subject.kill(lease)
    assert backend.batches_in_flight(None, 10) == []


def test_workers_are_listed_while_live_and_gone_once_they_say_so(backend):
    """Guarantee: "workers(): written at start, refreshed, deleted at exit": host, pid, queues, slots."""
    worker_id = uuid.uuid4()
    backend.worker_seen(worker_id, "host:42", ["t"], ["default"], host="host", pid=42, concurrency=4)
    (row,) = backend.live_worker_rows(30.0, None, 10)
    assert row[:7] == (worker_id, "host:42", "host", 42, ["t"], ["default"], 4)
    assert backend.live_workers(30.0) == 1
    backend.worker_gone(worker_id)
    assert backend.live_worker_rows(30.0, None, 10) == [] and backend.live_workers(30.0) == 0


def test_jobs_no_live_worker_can_take_are_reported(subject, enqueue, backend):
    """Guarantee: "Jobs no worker knows": queued jobs no live worker serving their queue has the task
    of are listed by queue and task; the table is advisory (it never decides a claim)."""
    enqueue("known")
    enqueue("unknown")
    backend.worker_seen(uuid.uuid4(), "host:1", ["known"], None)
    assert backend.untakeable(30.0) == [("default", "unknown", 1)]


def test_pages_of_jobs_are_by_keyset(subject, enqueue, backend):
    """Guarantee: "Pages by keyset, never OFFSET": a job enqueued between two pages never makes a page
    repeat a row."""
    ids = [enqueue() for _ in range(5)]
    page = [j["id"] for j in backend.list_jobs(state=None, queue=None, task=None, limit=2)]
    assert page == ids[:-3:-1]
    enqueue()
    rest = [j["id"] for j in backend.list_jobs(state=None, queue=None, task=None, limit=10, before=page[-1])]
    assert rest == ids[-3::-1]


def _fail(subject, job_id, error):
    lease = subject.lease()
    claimed = subject.claim_one(lease)
    assert claimed.id == job_id
    assert subject.record(lease, claimed, 1, "failed", error=error) == "failed"
    subject.commit(lease)


def test_failures_are_counted_by_error_class(subject, enqueue, backend):
    """Guarantee (read model): "failures by error class": the text before the first ':' of the last
    error, most frequent first."""
    for error in ("ValueError: a", "KeyError: b", "ValueError: c"):
        _fail(subject, enqueue(), error)
    assert [r[:3] for r in backend.failure_classes()] == [("default", "ValueError", 2), ("default", "KeyError", 1)]


def test_the_oldest_ready_job_is_reported_per_queue_without_jobs_in_flight(subject, enqueue, backend):
    """Guarantee (read model): "oldest ready job's age": per queue, the due jobs not in flight, and
    whether the queue is paused."""
    enqueue(queue="a")
    enqueue(queue="a")
    enqueue(queue="b")
    lease, book = subject.lease(), subject.bookkeeping()
    subject.start_attempt(book, lease, subject.claim_one(lease, ["a"]))  # in flight: not ready
    backend.pause_queue("b")
    rows = {r[0]: (r[1], r[4]) for r in backend.oldest_ready()}
    assert rows == {"a": (1, False), "b": (1, True)}
