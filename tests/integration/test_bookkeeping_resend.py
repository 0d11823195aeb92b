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


@pytest.mark.parametrize("again", [False, True])
def test_the_attempts_mark_is_not_sent_again_on_a_new_session(app: skiplock.App, db: psycopg.Connection,
                                                              again: bool):
    """``again=False`` (the attempt's mark): ConnectionLost, nothing written, and the next write gets a
    new session; the default (every other write): sent again on a new session."""
    [job_id] = app.enqueue_many([("t", {})])
    lease = app.backend.connect_lease("x")
    book = _lost_session(app, db)

    def attempts() -> int:
        return int(db.execute("SELECT count(*) FROM skiplock.job_attempts WHERE job_id = %s", [job_id]).fetchone()[0])

    try:
        lease.begin()
        [claimed] = app.backend.claim(lease, None, 1)
        mark = lambda c: app.backend.start_attempt(c, claimed, "w/0", lease.session_id, False)  # noqa: E731
        if again:
            assert book.run(mark)[0] == 1 and attempts() == 1
        else:
            with pytest.raises(ConnectionLost):
                book.run(mark, again=False)
            assert attempts() == 0
            assert book.run(mark, again=False)[0] == 1 and attempts() == 1  # the next write: a new session
        lease.rollback()
    finally:
        book.close()
        lease.close()
