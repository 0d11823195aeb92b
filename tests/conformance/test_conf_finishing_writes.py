"""Finishing writes of the transaction lease (docs/guarantees.md, "The claim", steps 2 and 4, and the
table's rows on lost COMMIT replies, pending errors, cancellation and snoozes)."""

from __future__ import annotations

from support import wait_for


def _running(subject, enqueue, **kw):
    """A job claimed on a fresh lease with its attempt counted: (job id, lease, bookkeeping, claimed, attempt)."""
    job_id = enqueue(**kw)
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim_one(lease)
    assert claimed.id == job_id
    attempt = subject.start_attempt(book, lease, claimed)[0]
    return job_id, lease, book, claimed, attempt


def test_done_commits_with_the_lease(subject, enqueue):
    """Guarantee: "Success: UPDATE jobs SET state = 'done' ... then COMMIT": done only if it commits."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    assert subject.complete(lease, claimed, attempt, result='{"x": 1}')
    subject.rollback(lease)
    assert subject.state(job_id) == "queued"
    claimed = subject.claim_one(lease)
    assert subject.complete(lease, claimed, attempt, result='{"x": 1}')
    subject.commit(lease)
    job = subject.job(job_id)
    assert (job["state"], job["attempts"], job["result"]) == ("done", 1, {"x": 1})


def test_a_lost_commit_reply_then_a_failure_record_is_a_no_op(subject, enqueue):
    """Guarantee: "COMMIT reply lost, then a failure record: guarded on state = 'queued': the done job
    stays done" (the worker records a failure from a fresh transaction for the same attempt)."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    assert subject.complete(lease, claimed, attempt)
    subject.commit(lease)  # committed; the worker never heard back
    assert subject.record(None, claimed, attempt, "queued", delay=1.0) is None
    assert subject.record(None, claimed, attempt, "failed") is None
    job = subject.job(job_id)
    assert (job["state"], job["attempts"], job["last_error"]) == ("done", 1, None)


def test_a_failure_is_recorded_in_the_lease_and_retried(subject, enqueue):
    """Guarantee: "Failure: ROLLBACK TO SAVEPOINT ..., the outcome is written, COMMIT": the handler's
    work is gone, the error recorded, the job queued again after its delay."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    subject.backend.savepoint(lease)
    subject.backend.rollback_to_savepoint(lease)
    assert subject.record(lease, claimed, attempt, "queued", error="ValueError: no", delay=3600) == "queued"
    subject.commit(lease)
    job = subject.job(job_id)
    assert (job["state"], job["attempts"], job["last_error"]) == ("queued", 1, "ValueError: no")
    assert [e["error"] for e in job["errors"]] == ["ValueError: no"]
    assert subject.claim_one(lease) is None  # not before its delay


def test_an_outcome_for_a_row_locked_elsewhere_is_kept_pending_then_folded_in_exactly_once(subject, enqueue):
    """Guarantee: "timed-out job's session slow to exit (its row still locked when the outcome is
    written): the error is kept with the attempt count and recorded by the next finishing write that
    commits" -- once: a write that rolls back leaves it pending, the one that commits folds it in."""
    job_id, lease, book, claimed, attempt = _running(subject, enqueue)
    assert subject.record(None, claimed, attempt, "queued", error="Timeout: slow", delay=0) is None  # locked
    assert subject.state(job_id) == "queued"
    subject.kill(lease)
    second = subject.lease()
    claimed = subject.claim_one(second)
    attempt2, _, unrecorded, _ = subject.start_attempt(book, second, claimed)
    assert (attempt2, unrecorded) == (2, "Timeout: slow")
    assert subject.complete(second, claimed, attempt2)
    subject.rollback(second)  # that write did not commit: the error is still pending
    claimed = subject.claim_one(second)
    attempt3 = subject.start_attempt(book, second, claimed)[0]
    assert subject.complete(second, claimed, attempt3)
    subject.commit(second)
    job = subject.job(job_id)
    assert job["state"] == "done"
    assert [e["error"] for e in job["errors"]] == ["Timeout: slow"]


def test_a_pending_error_and_the_same_attempts_record_are_not_doubled(subject, enqueue):
    """Guarantee: pending errors are recorded exactly once: a later record of the same attempt and
    error (the worker retrying its write) adds nothing beside the pending entry."""
    job_id, lease, book, claimed, attempt = _running(subject, enqueue, max_attempts=1)
    assert subject.record(None, claimed, attempt, "failed", error="E: once") is None  # locked: pending
    subject.kill(lease)
    assert subject.record(None, claimed, attempt, "failed", error="E: once") == "failed"
    job = subject.job(job_id)
    assert job["state"] == "failed"
    assert [e["error"] for e in job["errors"]] == ["E: once"]


def test_the_last_attempts_pending_error_fails_the_job_with_that_error(subject, enqueue):
    """Guarantee: "after the last attempt the job fails with that error": start_attempt past
    max_attempts hands back the pending error of the attempt that finished."""
    job_id, lease, book, claimed, attempt = _running(subject, enqueue, max_attempts=1)
    assert subject.record(None, claimed, attempt, "failed", error="E: last") is None
    subject.kill(lease)
    second = subject.lease()
    claimed = subject.claim_one(second)
    attempt2, _, unrecorded, _ = subject.start_attempt(book, second, claimed)
    assert (attempt2, unrecorded) == (2, "E: last")
    assert subject.record(second, claimed, attempt2 - 1, "failed", error=unrecorded) == "failed"
    subject.commit(second)
    job = subject.job(job_id)
    assert (job["state"], job["attempts"], job["last_error"]) == ("failed", 1, "E: last")
    assert [e["error"] for e in job["errors"]] == ["E: last"]


def test_cancel_wins_over_done(subject, enqueue, backend):
    """Guarantee: "a finishing done write never overwrites a cancellation": a cancel requested while
    the job is leased refuses its done; the outcome written is cancelled."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    assert backend.request_cancel(job_id, "stop") == "queued"
    assert not backend.cancel_if_unlocked(job_id)  # its lease holds it
    assert not subject.complete(lease, claimed, attempt)
    assert subject.record(lease, claimed, attempt, "failed", error="E: raced") == "cancelled"
    subject.commit(lease)
    job = subject.job(job_id)
    assert (job["state"], job["last_error"]) == ("cancelled", "cancelled: stop")


def test_a_cancel_request_is_seen_when_the_attempt_starts(subject, enqueue, backend):
    """Guarantee: start_attempt says a cancellation was requested (then the handler is not run)."""
    job_id = enqueue()
    assert backend.request_cancel(job_id, "not wanted") == "queued"
    lease, book = subject.lease(), subject.bookkeeping()
    claimed = subject.claim_one(lease)
    assert subject.start_attempt(book, lease, claimed)[1] == "not wanted"


def test_cancelling_a_job_nobody_holds_is_at_once_and_it_never_runs(subject, enqueue, backend):
    """Guarantee (App.cancel_job): "A queued job is cancelled at once and never runs"."""
    job_id = enqueue()
    assert backend.request_cancel(job_id, "r") == "queued"
    assert backend.cancel_if_unlocked(job_id)
    assert subject.state(job_id) == "cancelled"
    assert subject.claim_one(subject.lease()) is None


def test_ending_the_lease_holder_returns_the_job_for_its_cancellation(subject, enqueue, backend):
    """Guarantee (App.cancel_job): "A job running in a transaction lease is told by ending its
    session: its transaction rolls back ... and it ends cancelled"."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    assert backend.request_cancel(job_id, "r") == "queued"
    assert backend.end_lease_holder(job_id)
    wait_for(lambda: backend.cancel_if_unlocked(job_id), what="the ended lease to let go of the job")
    assert subject.state(job_id) == "cancelled"


def test_a_forgotten_cancel_request_no_longer_refuses_done(subject, enqueue, backend):
    """Guarantee (App.cancel_job): a request that did not take effect is forgotten (``forget_cancel_request``);
    then it no longer wins over the job's done."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    backend.request_cancel(job_id, "r")
    backend.forget_cancel_request(job_id)
    assert subject.complete(lease, claimed, attempt)
    subject.commit(lease)
    assert subject.state(job_id) == "done"


def test_a_finished_job_keeps_its_state_when_asked_to_cancel(subject, enqueue, backend):
    """Guarantee (App.cancel_job): "A job that already finished keeps its state"."""
    job_id, lease, _, claimed, attempt = _running(subject, enqueue)
    assert subject.complete(lease, claimed, attempt)
    subject.commit(lease)
    assert backend.request_cancel(job_id, "late") == "done"
    assert not backend.cancel_if_unlocked(job_id) and not backend.cancel_running(job_id)
    assert subject.state(job_id) == "done"


def test_a_snooze_gives_its_attempt_back(subject, enqueue):
    """Guarantee: "a handler snoozes: no attempt used up" (transaction lease: the attempt given is
    one less, with ``uncount``)."""
    job_id, lease, book, claimed, attempt = _running(subject, enqueue)
    assert subject.record(lease, claimed, attempt - 1, "queued", error=None, delay=0, uncount=True) == "queued"
    subject.commit(lease)
    assert subject.job(job_id)["attempts"] == 0
    claimed = subject.claim_one(lease)
    assert subject.start_attempt(book, lease, claimed)[0] == 1
