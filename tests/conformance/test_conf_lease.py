"""The lease (backend/base.py, ``Lease``): what the worker knows of a slot's session, through the
backend alone -- alive or not, a transaction open or in error, ending it, savepoints -- and the
errors it raises: skiplock's only (``ConnectionLost`` for a gone session, ``DatabaseError`` for a
refused statement on a live one). Also the backend's declared capabilities."""

from __future__ import annotations

import dataclasses

import pytest

from skiplock.backend.base import Capabilities
from skiplock.errors import ConnectionLost, DatabaseError, DatabaseUnavailable
from support import wait_for


def test_a_lease_is_alive_until_the_server_ends_its_session_and_then_commit_raises_connection_lost(subject, enqueue):
    """Guarantee (Lease): "ConnectionLost when the session is gone"; ``alive()`` is false and ``lost()``
    true once it is found gone, so the worker records the outcome from a fresh transaction."""
    job_id = enqueue()
    lease = subject.lease()
    assert lease.alive() and lease.idle() and not lease.in_transaction()
    lease.begin()
    assert subject.claim_one(lease).id == job_id
    assert lease.alive() and lease.in_transaction() and not lease.idle() and not lease.in_error()
    subject.kill(lease)  # by lease.session_id: the server's own id of the session (kill checks it exists)
    with pytest.raises(ConnectionLost) as info:
        lease.commit()
    assert isinstance(info.value, DatabaseUnavailable)
    assert not lease.alive() and lease.lost()
    assert not (lease.in_transaction() or lease.in_error() or lease.idle())
    assert subject.state(job_id) == "queued"


def test_ending_a_lease_returns_its_job(subject, enqueue):
    """Guarantee (Lease.end): "the server ends the session (rolling its transaction back, so its jobs
    are available again), then the connection is closed"; an ended lease is neither alive nor lost
    (it was ended on purpose), and ending it again is harmless."""
    job_id = enqueue()
    lease, other = subject.lease(), subject.lease()
    subject.never_wait(other)
    assert subject.claim_one(lease).id == job_id
    assert subject.claim_one(other) is None
    subject.rollback(other)
    lease.end()
    assert not lease.alive() and not lease.lost()
    lease.end()

    def claimed_again() -> bool:
        job = subject.claim_one(other)
        if job is None:
            subject.rollback(other)  # the ended session has not exited yet: look again
        return job is not None and job.id == job_id

    wait_for(claimed_again, 20, "the ended lease's job to be claimable")
    assert subject.job(job_id)["attempts"] == 0


def test_a_rollback_to_the_savepoint_keeps_the_lease(subject, backend, enqueue):
    """Guarantee (docs/guarantees.md, "The claim" 4): "ROLLBACK TO SAVEPOINT (the handler's writes
    vanish, the row lock is kept)"."""
    job_id = enqueue()
    lease, other = subject.lease(), subject.lease()
    subject.never_wait(other)
    job = subject.claim_one(lease)
    lease.savepoint()
    assert subject.complete(lease, job, 1)  # written inside the savepoint...
    lease.rollback_to_savepoint()  # ...and undone
    assert lease.in_transaction()
    assert subject.claim_one(other) is None  # the row lock is still the lease's
    lease.release_savepoint()
    lease.commit()
    assert lease.idle()
    row = subject.job(job_id)
    assert (row["state"], row["attempts"]) == ("queued", 0)


def test_a_statement_refused_on_a_live_lease_is_a_database_error_and_a_rollback_recovers_it(subject, enqueue):
    """Guarantee (Lease): "DatabaseError when the server refused a statement on a live session" -- never
    taken for a lost connection; the transaction is in error until rolled back."""
    enqueue()
    lease = subject.lease()
    assert subject.claim_one(lease) is not None
    with pytest.raises(DatabaseError) as info:
        lease.release_savepoint()  # no savepoint was taken: the server refuses it
    assert not isinstance(info.value, DatabaseUnavailable) and info.value.sqlstate
    assert lease.alive() and lease.in_error() and not lease.in_transaction() and not lease.lost()
    lease.rollback()
    assert lease.idle()


def test_the_backend_declares_its_capabilities_and_its_leases_say_whether_the_server_bounds_them(backend, subject):
    """Guarantee (base.Capabilities): the worker consults ``backend.capabilities``; a lease's
    ``bounded_by_server`` is the backend's ``server_bounds_lease``."""
    capabilities = backend.capabilities
    assert isinstance(capabilities, Capabilities)
    assert {f.name for f in dataclasses.fields(capabilities)} >= {"batched_claims", "listen_notify",
                                                                   "server_bounds_lease"}
    assert all(isinstance(getattr(capabilities, f.name), bool) for f in dataclasses.fields(capabilities))
    assert subject.lease().bounded_by_server is capabilities.server_bounds_lease


# ---- the one finishing verb: finish(lease, Finish) -------------------------------------------------


def _write(job, state: str, **kw):
    from conformance_support import WORKER
    from skiplock.backend.base import Write

    return Write(job, 1, state, job.claimed_at, WORKER, **kw)


def test_finish_in_the_lease_commits_with_it_and_a_late_fresh_failure_record_is_a_no_op(subject, backend, enqueue):
    """Guarantee: "A lost COMMIT reply is resolved by the guards on every finishing write" -- through
    ``finish``: ``done`` in the lease (Via.LEASE) commits with the lease; the same attempt's failure
    written afterwards from a fresh transaction (Via.FRESH) writes nothing."""
    from skiplock.backend.base import Finish, Via

    job_id = enqueue()
    lease = subject.lease()
    job = subject.claim_one(lease)
    assert backend.finish(lease, Finish(Via.LEASE, (_write(job, "done", result='{"ok": 1}'),))) == {job_id: "done"}
    lease.commit()
    assert backend.finish(None, Finish(Via.FRESH, (_write(job, "queued", delay=0.0, error="E: late"),))) == {}
    row = subject.job(job_id)
    assert (row["state"], row["result"]) == ("done", {"ok": 1})


def test_finish_releases_the_savepoint_of_a_handler_that_wrote_before_its_done(subject, backend, enqueue):
    """Guarantee: ``done`` with ``release`` (a handler that touched the database) releases the job's
    savepoint first, so the job's row is written by the top transaction (no MultiXact on
    PostgreSQL); the write still happens in the lease, uncommitted."""
    from skiplock.backend.base import Finish, Via

    ids = [enqueue() for _ in range(2)]
    lease = subject.lease()
    jobs = subject.claim(lease, limit=2)
    lease.savepoint()
    assert subject.complete(lease, jobs[1], 1)  # the handler's "write": kept
    done = _write(jobs[0], "done", release=True)
    assert backend.finish(lease, Finish(Via.LEASE, (done,))) == {ids[0]: "done"}
    with pytest.raises(DatabaseError):  # no savepoint left: the job's was released with its done
        lease.rollback_to_savepoint()
    lease.rollback()
    assert [subject.state(i) for i in ids] == ["queued", "queued"]


def test_finish_undoes_the_handler_s_writes_then_records_and_a_batch_commit_writes_only_its_jobs(
        subject, backend, enqueue):
    """Guarantee: a failure is recorded after rolling back to the job's savepoint and releasing it
    (``undo``: the row is written by the top transaction), in the lease; a batch's deferred ``done``
    writes go with its COMMIT (Via.BATCH_COMMIT), for the jobs given only: the others are released
    untouched."""
    from conformance_support import WORKER
    from skiplock.backend.base import Finish, Via

    ids = [enqueue() for _ in range(3)]
    lease, book = subject.lease(), subject.bookkeeping()
    jobs = subject.claim(lease, limit=3)
    batch, _, _ = backend.start_batch(book, jobs, WORKER, lease.session_id)
    lease.savepoint()
    assert subject.complete(lease, jobs[0], 1)  # the handler's "write", undone below
    failed = _write(jobs[0], "failed", error="E: boom", undo=True)
    assert backend.finish(lease, Finish(Via.LEASE, (failed,))) == {ids[0]: "failed"}
    written = backend.finish(lease, Finish(Via.BATCH_COMMIT, (_write(jobs[1], "done"),), batch))
    assert written == {ids[1]: "done"} and lease.idle()  # committed
    assert [subject.state(i) for i in ids] == ["failed", "done", "queued"]
    assert subject.job(ids[2])["attempts"] == 0
