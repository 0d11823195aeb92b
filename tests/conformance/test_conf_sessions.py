"""The sessions the backend opens: READ COMMITTED whatever the database's default, and lease
transactions the server itself bounds (docs/guarantees.md: "database default isolation", "lease idle
past lease_timeout", and a task's ``timeout``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from conformance_support import new_job
from support import wait_for

LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)  # due whatever the claiming transaction's start


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_every_lease_runs_at_read_committed_whatever_the_database_default(make_subject, level):
    """Guarantee: "every skiplock session runs at READ COMMITTED": a lease's next claim, in the same
    transaction, sees a job committed after that transaction began (a snapshot isolation would not),
    and two leases claim different rows with no serialization failure."""
    subject = make_subject()
    subject.database_default_isolation(level)
    backend = subject.backend
    first = backend.enqueue([new_job(run_at=LONG_AGO)])[0]
    a, b = subject.lease(), subject.lease()
    assert subject.claim_one(a).id == first
    later = backend.enqueue([new_job(run_at=LONG_AGO)])[0]
    held = subject.claim(a, limit=10)  # its own lock is not skipped: both rows
    assert [j.id for j in held] == [first, later]
    assert subject.claim_one(b) is None
    assert all(subject.complete(a, j, 1) for j in held)
    subject.commit(a)
    assert (subject.state(first), subject.state(later)) == ("done", "done")


@pytest.mark.capability("server_bounds_leases")
@pytest.mark.parametrize("savepoint", [False, True], ids=["claim", "claim-with-savepoint"])
def test_a_lease_idle_past_lease_timeout_is_ended_by_the_server(make_subject, savepoint):
    """Guarantee: "lease idle past lease_timeout: the server ends the session; the attempt rolls back
    and is recorded" -- the job is claimable again and its attempt counted. Whatever the claim's
    round trip: with the job's savepoint it is a pipeline, and on PostgreSQL 15 a lease left idle
    after one was never ended (the pipeline's closing Flush turned the timer off; opening.py)."""
    subject = make_subject(lease_timeout=1.0)
    job_id = subject.backend.enqueue([new_job()])[0]
    lease, book = subject.lease(), subject.bookkeeping()
    assert subject.start_attempt(book, lease, subject.claim(lease, savepoint=savepoint)[0])[0] == 1
    other = subject.lease()
    again = wait_for(lambda: subject.claim_one(other) or subject.rollback(other), what="the server to end the lease")
    assert again.id == job_id
    assert subject.start_attempt(book, other, again)[0] == 2


@pytest.mark.capability("server_bounds_leases")
def test_a_tasks_timeout_ends_its_lease_on_the_server(subject, enqueue, backend):
    """Guarantee (executor): "A task timeout is enforced twice: PostgreSQL ends the job's transaction
    (statement, idle and transaction timeouts set locally)": set_local_timeouts bounds this lease only."""
    job_id = enqueue()
    lease = subject.lease()
    subject.claim_one(lease)
    backend.set_local_timeouts(lease, 0.5)
    other = subject.lease()
    again = wait_for(lambda: subject.claim_one(other) or subject.rollback(other), what="the server to end the lease")
    assert again.id == job_id
