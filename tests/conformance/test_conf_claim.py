"""The claim (docs/guarantees.md, "The claim"): SKIP LOCKED, the transaction is the lease."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from conformance_support import new_job
from support import wait_for


def test_a_claim_skips_rows_locked_by_another_lease_without_waiting(subject, enqueue):
    """Guarantee: "FOR UPDATE SKIP LOCKED": a lease never waits on a row another lease holds; it takes
    the next available one, or nothing."""
    first, second = enqueue(), enqueue()
    a, b, c = subject.lease(), subject.lease(), subject.lease()
    for conn in (b, c):
        subject.never_wait(conn)
    assert subject.claim_one(a).id == first
    assert subject.claim_one(b).id == second
    assert subject.claim_one(c) is None


def test_a_rollback_returns_the_job(subject, enqueue):
    """Guarantee: "any rollback (exception, kill, lost connection) is the end of the lease": the job
    is claimable again, untouched."""
    job_id = enqueue()
    a, b = subject.lease(), subject.lease()
    assert subject.claim_one(a).id == job_id
    assert subject.claim_one(b) is None
    subject.rollback(b)
    subject.rollback(a)
    again = subject.claim_one(b)
    assert again.id == job_id and again.attempts == 0


def test_a_killed_lease_session_returns_the_job(subject, enqueue):
    """Guarantee: "worker SIGKILLed mid-job: the server rolls the transaction back; another worker
    redoes the job" -- here the lease's session is ended from outside."""
    job_id = enqueue()
    a, b = subject.lease(), subject.lease()
    assert subject.claim_one(a).id == job_id
    subject.kill(a)
    assert subject.claim_one(b).id == job_id
    assert subject.state(job_id) == "queued"


def test_terminating_a_lease_session_returns_the_job(subject, enqueue, backend):
    """Guarantee: ``terminate`` (what the worker uses to give up a timed-out handler) ends the session:
    the server rolls the lease back and the job is claimable again."""
    job_id = enqueue()
    a, b = subject.lease(), subject.lease()
    assert subject.claim_one(a).id == job_id
    backend.terminate([subject.session(a)])
    again = wait_for(lambda: subject.claim_one(b) or subject.rollback(b), what="the terminated lease to let go")
    assert again.id == job_id


def test_claim_order_is_priority_then_run_at_then_id_and_a_future_run_at_waits(subject, enqueue):
    """Guarantee: "ORDER BY priority, run_at, id" per claim; a job is not claimed before its run_at."""
    enqueue(run_at=datetime.now(timezone.utc) + timedelta(hours=1))
    low = enqueue(priority=5)
    high = enqueue(priority=-1)
    middle = enqueue(priority=0)
    lease = subject.lease()
    assert [j.id for j in subject.claim(lease, limit=10)] == [high, middle, low]


@pytest.mark.parametrize("queues", [["default"], ["default", "other"], None], ids=["one", "several", "every"])
def test_within_a_priority_the_job_due_first_is_claimed_first(subject, enqueue, queues):
    """Guarantee: within a priority, claims take jobs in the order they became due (run_at), then by
    id: a job scheduled for an earlier time, or a retry's job back after its backoff, does not jump
    ahead of jobs due before it because of its lower id, nor wait behind later ones because of a
    higher id -- by each claim statement (one queue, several, every queue)."""
    now = datetime.now(timezone.utc)
    later = enqueue(run_at=now - timedelta(minutes=1))
    earlier = enqueue(run_at=now - timedelta(minutes=10))
    tied = [enqueue(run_at=now - timedelta(minutes=5)) for _ in range(2)]
    urgent = enqueue(priority=-1, run_at=now)
    enqueue(run_at=now + timedelta(hours=1))  # not due: never claimed
    lease = subject.lease()
    assert [j.id for j in subject.claim(lease, queues, limit=10)] == [urgent, earlier, *tied, later]
    subject.rollback(lease)
    assert [j.id for j in subject.claim(lease, queues, tasks=["t"], limit=10)] == [urgent, earlier, *tied, later]


def test_a_claim_takes_only_the_tasks_it_names(subject, enqueue):
    """Guarantee: "a worker never claims a job it has no handler for": the claim's ``tasks`` filter;
    the other task's job stays queued, untouched."""
    other = enqueue("theirs")
    mine = enqueue("mine")
    lease = subject.lease()
    assert [j.id for j in subject.claim(lease, tasks=["mine"], limit=10)] == [mine]
    subject.rollback(lease)
    job = subject.job(other)
    assert (job["state"], job["attempts"]) == ("queued", 0)


def test_a_claim_takes_only_the_queues_it_names(subject, enqueue):
    """Guarantee: a claim of queues (one, several, or every queue with None) takes jobs of those only."""
    a = enqueue(queue="a")
    b = enqueue(queue="b")
    c = enqueue(queue="c")
    lease = subject.lease()
    assert [j.id for j in subject.claim(lease, ["b"], limit=10)] == [b]
    subject.rollback(lease)
    assert [j.id for j in subject.claim(lease, ["a", "c"], limit=10)] == [a, c]
    subject.rollback(lease)
    assert [j.id for j in subject.claim(lease, None, limit=10)] == [a, b, c]


@pytest.mark.parametrize("tasks", [None, ["t"]], ids=["any-task", "its-tasks"])
def test_a_claim_of_several_queues_keeps_one_order_across_them_and_skips_only_locked_jobs(subject, enqueue, tasks):
    """Guarantee: over several named queues, one (priority, run_at, id) order across them, and SKIP
    LOCKED row by row in that order: a job another lease holds is skipped and the next one in order
    is taken, whichever queue it is in; a job a claim does not return is not held (the next lease
    takes it). A queue named twice is claimed once."""
    a1 = enqueue(queue="a", priority=1)
    b0 = enqueue(queue="b", priority=0)
    a0 = enqueue(queue="a", priority=0)
    enqueue(queue="c", priority=-1)  # not named: never taken
    b1 = enqueue(queue="b", priority=1)
    a2 = enqueue(queue="a", priority=2)
    x, y, z = subject.lease(), subject.lease(), subject.lease()
    for conn in (y, z):
        subject.never_wait(conn)
    assert [j.id for j in subject.claim(x, ["a", "b"], tasks=tasks, limit=2)] == [b0, a0]
    assert [j.id for j in subject.claim(y, ["b", "a"], tasks=tasks, limit=2)] == [a1, b1]
    assert [j.id for j in subject.claim(z, ["a", "b", "a"], tasks=tasks, limit=10)] == [a2]


def test_a_batch_claim_locks_every_job_it_returns(subject, enqueue):
    """Guarantee (docs/batches.md): a claim with limit > 1 locks that many jobs in one transaction;
    another lease skips all of them."""
    ids = [enqueue() for _ in range(5)]
    a, b = subject.lease(), subject.lease()
    subject.never_wait(b)
    assert [j.id for j in subject.claim(a, limit=3)] == ids[:3]
    assert [j.id for j in subject.claim(b, limit=10)] == ids[3:]


def test_enqueue_in_the_callers_transaction_exists_only_if_it_commits(subject, backend):
    """Guarantee: "on ``conn`` they exist only if the caller commits"; ids in input order, ascending."""
    conn = subject.producer()
    ids = backend.enqueue([new_job("a"), new_job("b"), new_job("c")], conn)
    assert ids == sorted(ids) and len(set(ids)) == 3
    lease = subject.lease()
    assert subject.claim(lease, limit=10) == []  # not committed: invisible
    subject.rollback(conn)
    assert all(backend.get_job(i) is None for i in ids)
    kept = backend.enqueue([new_job("a"), new_job("b")], conn)
    subject.commit(conn)
    subject.rollback(lease)  # a new lease transaction: its now() is after the commit
    assert [j.task for j in subject.claim(lease, limit=10) if j.id in kept] == ["a", "b"]
