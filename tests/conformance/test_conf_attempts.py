"""Attempt counting outside the lease, and batches (docs/guarantees.md, "The claim" step 2;
docs/batches.md)."""

from __future__ import annotations

from conformance_support import WORKER


def _claim_and_count(subject, book, exclusive=True):
    lease = subject.lease()
    claimed = subject.claim_one(lease)
    return lease, claimed, subject.start_attempt(book, lease, claimed, exclusive)


def test_an_attempt_is_counted_outside_the_lease_and_survives_its_rollback(subject, enqueue):
    """Guarantee: "The attempt is counted in job_attempts on a separate autocommit connection. That
    write never waits on the job's row lock and survives the job's rollback"; an attempt that never
    finished and ran alone in its process (``exclusive``) is charged."""
    job_id = enqueue()
    book = subject.bookkeeping()
    subject.never_wait(book)
    lease, claimed, (attempt, _, _, suspect) = _claim_and_count(subject, book)
    assert (attempt, suspect) == (1, False)
    subject.kill(lease)
    lease, claimed, (attempt, _, _, suspect) = _claim_and_count(subject, book)
    assert (attempt, suspect) == (2, True)
    assert claimed.attempts == 0  # the row itself was rolled back


def test_an_unfinished_attempt_that_shared_its_process_is_not_charged(subject, enqueue, backend):
    """Guarantee: "When a worker with several slots dies, none of the jobs in flight in it is charged:
    each becomes a suspect"; its next run, marked exclusive, is charged if it dies too."""
    job_id = enqueue()
    book = subject.bookkeeping()
    lease, _, (attempt, _, _, _) = _claim_and_count(subject, book, exclusive=False)
    subject.kill(lease)
    lease, _, (attempt, _, _, suspect) = _claim_and_count(subject, book, exclusive=False)
    assert (attempt, suspect) == (1, True)
    backend.mark_exclusive(book, job_id, attempt)
    subject.kill(lease)
    assert _claim_and_count(subject, book, exclusive=False)[2][0] == 2


def test_a_job_that_kills_its_worker_every_time_runs_out_of_attempts(subject, enqueue):
    """Guarantee: "handler kills its worker every time: attempts counted outside the transaction;
    failed after max_attempts": start_attempt then numbers an attempt past max_attempts, with no
    unrecorded error (the worker fails the job saying why)."""
    enqueue(max_attempts=2)
    book = subject.bookkeeping()
    for expected in (1, 2):
        lease, _, (attempt, _, _, _) = _claim_and_count(subject, book)
        assert attempt == expected
        subject.kill(lease)
    lease, claimed, (attempt, _, unrecorded, _) = _claim_and_count(subject, book)
    assert (attempt, unrecorded) == (3, None) and attempt > claimed.max_attempts


def test_a_finished_attempt_is_not_a_suspect(subject, enqueue):
    """Guarantee: only an attempt that never finished makes the job a suspect."""
    enqueue()
    book = subject.bookkeeping()
    lease, claimed, (attempt, _, _, _) = _claim_and_count(subject, book)
    assert subject.record(lease, claimed, attempt, "queued", delay=0) == "queued"
    subject.commit(lease)
    assert _claim_and_count(subject, book)[2] == (2, None, None, False)


def test_complete_batch_writes_done_for_the_given_ids_only_and_releases_the_rest(subject, enqueue, backend):
    """Guarantee (docs/batches.md): the jobs written done commit together with the batch; jobs the
    batch claimed but did not start are released by the COMMIT, untouched."""
    ids = [enqueue() for _ in range(4)]
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim(lease, limit=4)
    batch, suspects, cancels = backend.start_batch(book, claimed, WORKER, subject.session(lease))
    assert (suspects, cancels) == (set(), {})
    done = [(j, 1, None) for j in claimed[:2]]
    assert backend.complete_batch(lease, batch, done, claimed[0].claimed_at, WORKER) == set(ids[:2])
    assert [subject.state(i) for i in ids] == ["done", "done", "queued", "queued"]
    assert [subject.job(i)["attempts"] for i in ids[2:]] == [0, 0]
    assert [j.id for j in subject.claim(subject.lease(), limit=10)] == ids[2:]


def test_complete_batch_refuses_a_job_asked_to_cancel(subject, enqueue, backend):
    """Guarantee: cancel wins over done in a batch too: "a job missing was refused (a cancellation was
    requested) and is still queued"."""
    ids = [enqueue() for _ in range(2)]
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim(lease, limit=2)
    batch, _, _ = backend.start_batch(book, claimed, WORKER, subject.session(lease))
    backend.request_cancel(ids[1], "stop")
    assert backend.complete_batch(lease, batch, [(j, 1, None) for j in claimed], claimed[0].claimed_at,
                                  WORKER) == {ids[0]}
    assert backend.cancel_if_unlocked(ids[1])
    assert [subject.state(i) for i in ids] == ["done", "cancelled"]


def test_the_jobs_of_a_batch_that_died_are_suspects_and_run_alone_counted(subject, enqueue, backend):
    """Guarantee: "one row in job_batches marks the whole batch ... a job of a batch that died runs
    alone with a counted attempt" and is not charged for the batch's crash."""
    ids = [enqueue() for _ in range(3)]
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim(lease, limit=3)
    backend.start_batch(book, claimed, WORKER, subject.session(lease))
    subject.kill(lease)
    lease = subject.lease()
    again = subject.claim(lease, limit=3)
    assert backend.start_batch(book, again, WORKER, subject.session(lease))[1] == set(ids)
    subject.rollback(lease)
    lease = subject.lease()
    one = subject.claim_one(lease)
    assert subject.start_attempt(book, lease, one, exclusive=False)[::3] == (1, True)
