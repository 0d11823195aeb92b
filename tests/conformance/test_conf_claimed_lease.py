"""The claimed lease: the row says running with an owner token and an expiry; finishing writes are
fenced on both (docs/guarantees.md: claimed-lease rows, "every path that re-queues a job")."""

from __future__ import annotations

import uuid

from support import wait_for


def _started(subject, enqueue, lease_seconds=60.0, **kw):
    """A claimed-lease job started and committed: (job id, claimed, owner, attempt)."""
    job_id = enqueue(**kw)
    conn = subject.lease()
    claimed = subject.claim_one(conn)
    owner = uuid.uuid4()
    attempt, reason = subject.backend.start_claimed(conn, claimed, owner, lease_seconds, "w/0")
    subject.commit(conn)
    assert reason is None
    return job_id, claimed, owner, attempt


def _expire(subject, job_id):
    wait_for(lambda: job_id in dict(subject.backend.rescue_expired()), what="the rescuer to return the job")


def test_start_claimed_counts_the_attempt_and_shows_running(subject, enqueue):
    """Guarantee: "the attempt is counted when the claim commits"; the row says running."""
    job_id, claimed, owner, attempt = _started(subject, enqueue)
    job = subject.job(job_id)
    assert (attempt, job["state"], job["attempts"]) == (1, "running", 1)
    assert job["lease_expires_at"] is not None
    assert subject.claim_one(subject.lease()) is None  # running: not claimable


def test_the_owner_completes_outside_any_lock(subject, enqueue):
    """Guarantee: the fence is the lease, not a lock: the owner's complete from a pooled connection
    (``conn`` None) is written done."""
    job_id, claimed, owner, attempt = _started(subject, enqueue)
    assert subject.complete(None, claimed, attempt, owner=owner)
    assert subject.state(job_id) == "done"


def test_the_fence_refuses_a_late_writer_after_a_rescue(subject, enqueue):
    """Guarantee: "claimed lease: ... fenced, a rescued job is not ours": once the lease expired and
    the rescuer returned the job, the old owner's complete and record_outcome are refused."""
    job_id, claimed, owner, attempt = _started(subject, enqueue, lease_seconds=0.001)
    _expire(subject, job_id)
    assert not subject.complete(None, claimed, attempt, owner=owner)
    assert subject.record(None, claimed, attempt, "failed", owner=owner) is None
    job = subject.job(job_id)
    assert (job["state"], job["attempts"]) == ("queued", 1)


def test_the_fence_refuses_a_late_writer_once_another_owner_runs_the_job(subject, enqueue):
    """Guarantee: the fence is the owner token: a new owner's lease is not the old owner's to finish."""
    job_id, claimed, owner, attempt = _started(subject, enqueue, lease_seconds=0.001)
    _expire(subject, job_id)
    conn = subject.lease()
    again = subject.claim_one(conn)
    new_owner = uuid.uuid4()
    assert subject.backend.start_claimed(conn, again, new_owner, 60.0, "w/1") == (2, None)
    subject.commit(conn)
    assert not subject.complete(None, claimed, attempt, owner=owner)
    assert subject.complete(None, again, 2, owner=new_owner)
    assert subject.job(job_id)["attempts"] == 2


def test_the_rescuer_returns_an_expired_lease_to_the_queue_with_its_attempt_used(subject, enqueue):
    """Guarantee: "Claimed lease: a worker process that dies charges one attempt ... the rescuer returns
    each job with that attempt used", the lapse recorded; the next claim numbers the next attempt."""
    job_id, claimed, owner, attempt = _started(subject, enqueue, lease_seconds=0.001)
    _expire(subject, job_id)
    job = subject.job(job_id)
    assert (job["state"], job["attempts"]) == ("queued", 1)
    assert job["last_error"].startswith("lease expired") and [e["error"] for e in job["errors"]] == ["lease expired"]
    conn = subject.lease()
    again = subject.claim_one(conn)
    assert subject.backend.start_claimed(conn, again, uuid.uuid4(), 60.0, "w/1") == (2, None)


def test_the_rescuer_fails_a_job_after_its_last_attempt(subject, enqueue):
    """Guarantee: "every path that re-queues a job is bounded by max_attempts: ... the rescuer (failed
    after the last attempt)", with the reason recorded."""
    job_id, claimed, owner, attempt = _started(subject, enqueue, lease_seconds=0.001, max_attempts=1)
    wait_for(lambda: dict(subject.backend.rescue_expired()).get(job_id) == "failed", what="the rescue")
    job = subject.job(job_id)
    assert (job["state"], job["attempts"]) == ("failed", 1)
    assert job["last_error"].startswith("lease expired")


def test_the_rescuer_leaves_live_leases_alone(subject, enqueue):
    """Guarantee: only "leases nobody renewed" are returned."""
    job_id, claimed, owner, attempt = _started(subject, enqueue, lease_seconds=3600)
    assert job_id not in dict(subject.backend.rescue_expired())
    assert subject.state(job_id) == "running"


def test_heartbeat_extends_only_leases_still_owned(subject, enqueue):
    """Guarantee: heartbeat "returns the ids still owned (a missing id is a lost lease)"."""
    mine, _, owner, _ = _started(subject, enqueue, lease_seconds=60)
    lost, _, lost_owner, _ = _started(subject, enqueue, lease_seconds=0.001)
    _expire(subject, lost)
    assert subject.backend.heartbeat([(mine, owner, 60.0), (lost, lost_owner, 60.0)]) == {mine}
    assert subject.backend.heartbeat([(mine, uuid.uuid4(), 60.0)]) == set()


def test_cancel_of_a_running_claimed_job_refuses_its_owner(subject, enqueue, backend):
    """Guarantee: "cancel_running: cancelled directly; the worker's fenced finishing write will be
    refused" (cancel wins over done, claimed lease)."""
    job_id, claimed, owner, attempt = _started(subject, enqueue)
    assert backend.request_cancel(job_id, "stop") == "running"
    assert backend.cancel_running(job_id)
    assert not subject.complete(None, claimed, attempt, owner=owner)
    job = subject.job(job_id)
    assert (job["state"], job["last_error"]) == ("cancelled", "cancelled: stop")


def test_a_claimed_snooze_gives_its_attempt_back(subject, enqueue):
    """Guarantee: "a handler snoozes: no attempt used up, in either lease mode" (claimed: the attempt
    written is one less)."""
    job_id, claimed, owner, attempt = _started(subject, enqueue)
    assert subject.record(None, claimed, attempt - 1, "queued", error=None, delay=0, owner=owner) == "queued"
    job = subject.job(job_id)
    assert (job["state"], job["attempts"]) == ("queued", 0)
