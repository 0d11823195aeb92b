"""Every finishing write wakes the job's waiters (App.wait: "Woken by LISTEN/NOTIFY ... the finishing
write notifies only jobs someone waits on"); an enqueue wakes idle workers. Driven through the
backend's listener (connect_listener) and waiter registry (add_waiter)."""

from __future__ import annotations

import uuid

import pytest

from conformance_support import new_job
from support import wait_for


@pytest.fixture
def waiting(subject, backend):
    """A listener waiting on a job: returns ``wait(job_id) -> woken?``."""
    listener = subject.listener()

    def register(job_id: int):
        backend.add_waiter(job_id)
        return lambda: subject.woken(listener, subject.notice(job_id))

    return register


def _leased(subject, enqueue, **kw):
    job_id = enqueue(**kw)
    lease = subject.lease()
    claimed = subject.claim_one(lease)
    assert claimed.id == job_id
    return job_id, lease, claimed


def test_complete_wakes_waiters(subject, enqueue, waiting):
    """Guarantee: a done job's waiter is woken when the done commits."""
    job_id, lease, claimed = _leased(subject, enqueue)
    woken = waiting(job_id)
    assert subject.complete(lease, claimed, 1)
    subject.commit(lease)
    assert woken()


@pytest.mark.parametrize("state", ["failed", "cancelled"])
def test_a_failed_or_cancelled_record_wakes_waiters(subject, enqueue, waiting, state):
    """Guarantee: record_outcome of a final state wakes the job's waiters."""
    job_id, lease, claimed = _leased(subject, enqueue)
    woken = waiting(job_id)
    assert subject.record(lease, claimed, 1, state) == state
    subject.commit(lease)
    assert woken()


def test_complete_batch_wakes_waiters(subject, enqueue, waiting):
    """Guarantee: every job a batch writes done wakes its waiters."""
    ids = [enqueue() for _ in range(2)]
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim(lease, limit=2)
    woken = [waiting(i) for i in ids]
    batch, _, _ = subject.backend.start_batch(book, claimed, "w/0", subject.session(lease))
    assert subject.backend.complete_batch(lease, batch, [(j, 1, None) for j in claimed], claimed[0].claimed_at,
                                          "w/0") == set(ids)
    assert all(w() for w in woken)


def test_cancelling_a_queued_job_wakes_waiters(subject, enqueue, backend, waiting):
    """Guarantee: a cancellation is a finishing write: its waiters are woken."""
    job_id = enqueue()
    woken = waiting(job_id)
    backend.request_cancel(job_id, "r")
    assert backend.cancel_if_unlocked(job_id)
    assert woken()


def test_cancelling_a_running_claimed_job_wakes_waiters(subject, enqueue, backend, waiting):
    """Guarantee: cancel_running ends the job: its waiters are woken."""
    job_id, lease, claimed = _leased(subject, enqueue)
    backend.start_claimed(lease, claimed, uuid.uuid4(), 60.0, "w/0")
    subject.commit(lease)
    woken = waiting(job_id)
    backend.request_cancel(job_id, "r")
    assert backend.cancel_running(job_id)
    assert woken()


def test_the_rescuer_failing_a_job_wakes_waiters(subject, enqueue, backend, waiting):
    """Guarantee: a lease the rescuer ends ``failed`` (no attempt left) is finished: its waiters are
    woken."""
    job_id, lease, claimed = _leased(subject, enqueue, max_attempts=1)
    backend.start_claimed(lease, claimed, uuid.uuid4(), 0.001, "w/0")
    subject.commit(lease)
    woken = waiting(job_id)
    wait_for(lambda: dict(backend.rescue_expired()).get(job_id) == "failed", what="the rescue")
    assert woken()


def test_a_removed_waiter_is_not_woken(subject, enqueue, backend):
    """Guarantee: "the finishing write notifies only jobs someone waits on": after remove_waiter, a job's
    finish sends nothing (seen in commit order: a later job's wake-up arrives, the earlier one's never)."""
    listener = subject.listener()
    first, second = enqueue(), enqueue()
    backend.add_waiter(first)
    backend.add_waiter(second)
    backend.remove_waiter(first)
    lease = subject.lease()
    for job_id in (first, second):  # one transaction each: their wake-ups arrive in this order
        job = subject.claim_one(lease)
        assert job.id == job_id and subject.complete(lease, job, 1)
        subject.commit(lease)
    assert subject.woken(listener, subject.notice(second))
    assert not subject.woken(listener, subject.notice(first), timeout=0)


def test_an_enqueue_wakes_idle_workers_at_commit(subject, backend):
    """Guarantee: "One NOTIFY on the fixed channel skiplock wakes idle workers when the inserting
    transaction commits"."""
    listener = subject.listener()
    conn = subject.producer()
    backend.enqueue([new_job()], conn)
    subject.commit(conn)
    assert subject.woken(listener, backend.wake_payload)
