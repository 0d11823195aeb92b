"""The slot's bookkeeping session (worker/bookkeeping.py) when it is lost: most writes are sent again
on a new session, but the attempt's mark (``start_attempt``, and ``start_batch``) is not. A session
lost with the server took the job's lease too; another worker may since have claimed and finished the
job, and a mark sent again after that left an attempt row behind a done job (seen once in CI, a
MariaDB crash-restart scenario: "job_attempts: 1 row(s) left behind"). The slot gets ConnectionLost,
ends its lease and starts over."""

from __future__ import annotations

import psycopg
import pytest

import skiplock
from skiplock.errors import ConnectionLost
from skiplock.worker.bookkeeping import Bookkeeping


def _lost_session(app: skiplock.App, db: psycopg.Connection) -> Bookkeeping:
    """A Bookkeeping whose thread's session the server has just ended."""
    book = Bookkeeping(app.backend)
    pid = book.run(lambda c: c.conn.info.backend_pid)
    db.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    return book


def test_a_lost_session_is_not_used_again_for_the_attempts_mark(app: skiplock.App, db: psycopg.Connection):
    [job_id] = app.enqueue_many([("t", {})])
    lease = app.backend.connect_lease("x")
    book = _lost_session(app, db)
    try:
        lease.begin()
        [claimed] = app.backend.claim(lease, None, 1)
        with pytest.raises(ConnectionLost):
            book.run(lambda c: app.backend.start_attempt(c, claimed, "w/0", lease.session_id, False), again=False)
        assert db.execute("SELECT count(*) FROM skiplock.job_attempts WHERE job_id = %s",
                          [job_id]).fetchone()[0] == 0
        # the next write gets a new session
        assert book.run(lambda c: app.backend.start_attempt(c, claimed, "w/0", lease.session_id, False),
                        again=False)[0] == 1
        lease.rollback()
    finally:
        book.close()
        lease.close()


def test_other_writes_are_sent_again_on_a_new_session(app: skiplock.App, db: psycopg.Connection):
    [job_id] = app.enqueue_many([("t", {})])
    lease = app.backend.connect_lease("x")
    book = _lost_session(app, db)
    try:
        lease.begin()
        [claimed] = app.backend.claim(lease, None, 1)
        assert book.run(lambda c: app.backend.start_attempt(c, claimed, "w/0", lease.session_id, False))[0] == 1
        assert db.execute("SELECT count(*) FROM skiplock.job_attempts WHERE job_id = %s",
                          [job_id]).fetchone()[0] == 1
        lease.rollback()
    finally:
        book.close()
        lease.close()
