"""A cancel that ends a running job's session, raced with the slot's own finishing write.

``cancel_job`` records its request, ends the job's session and cancels the row once the dying session
has released it. The slot whose session died writes its outcome from a fresh transaction that never
waits on a row lock -- so it may skip the row while the session is still exiting, and the cancel then
wins the row. Either way the slot must report a cancel (``CancelledWhileRunning``: logged as a cancel,
never as a lost database); a session lost without any cancel stays a lost connection."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from skiplock.errors import ConnectionLost
from skiplock.job import Failed
from skiplock.worker.completer import CancelledWhileRunning, Completer
from support import wait_for


def _claimed_on_a_lease(app):
    job_id = app.enqueue("t", {})
    lease = app.backend.connect_lease("skiplock-worker cancel-race")
    lease.begin()
    (claimed,) = app.backend.claim(lease.conn, None, limit=1)
    assert claimed.id == job_id
    return lease, claimed


def test_a_cancel_that_took_the_row_after_the_session_died_is_reported_as_a_cancel(app):
    lease, claimed = _claimed_on_a_lease(app)
    try:
        assert app.backend.request_cancel(claimed.id, "by the test") == "queued"
        app.backend.terminate([lease.session_id])  # what cancel_job does to a running job's session
        wait_for(lambda: app.backend.cancel_if_unlocked(claimed.id), 30, "the cancel to take the released row")
        # the slot finds out only now: its write from a fresh transaction finds the job cancelled already
        with pytest.raises(CancelledWhileRunning) as ended:
            Completer(app.backend).write(lease, claimed, 1, Failed("the connection was lost"),
                                         datetime.now(timezone.utc), "slot", False)
        assert ended.value.claimed.id == claimed.id
        assert app.get_job(claimed.id).state == "cancelled"
    finally:
        lease.close()


def test_a_session_lost_without_a_cancel_stays_a_lost_connection(app):
    lease, claimed = _claimed_on_a_lease(app)
    try:
        app.backend.terminate([lease.session_id])
        with pytest.raises(ConnectionLost) as lost:
            Completer(app.backend).write(lease, claimed, 1, Failed("the connection was lost"),
                                         datetime.now(timezone.utc), "slot", False)
        assert not isinstance(lost.value, CancelledWhileRunning)
        job = app.get_job(claimed.id)
        assert job.state == "failed" and "the connection was lost" in (job.last_error or "")  # its outcome, written
    finally:
        lease.close()
