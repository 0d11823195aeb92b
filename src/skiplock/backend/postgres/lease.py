"""The PostgreSQL lease: a worker slot's psycopg connection behind the port's ``Lease`` (base.py).

The worker never touches the driver: it begins, commits and rolls back through these methods, takes
the job's savepoints through them, asks them whether the session is alive or a transaction is open,
and ends a lease with ``end()``. Every method raises only skiplock errors (``errors.translate``):
:class:`~skiplock.errors.ConnectionLost` for a session that is gone, :class:`~skiplock.errors.DatabaseError`
for a statement the server refused on a live session (a deferred constraint at COMMIT, say).

``conn`` is the psycopg connection itself, what a handler sees as ``job.conn``; the backend's verbs
that take a lease run their statements on it.

Server-side bounds (``bounded_by_server``): a lease session opened with them ends a transaction idle
longer than ``lease_timeout`` (``idle_in_transaction_session_timeout``) and, on PostgreSQL 17+, one
open longer (``transaction_timeout``); a task's ``timeout`` is set for its transaction
(``set_local_timeouts``). Without them (``Capabilities(server_bounds_lease=False)``), the worker's
watchdog ends over-long leases with ``end()``.

Behind a connection pooler (pooler.py) the bounds are set per transaction instead, by ``begin()``,
which also reads the server session the transaction runs on (a transaction pooler may pick another
one each time): ``session_id`` is that session's pid, and ``end()`` ends that transaction only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import psycopg
from psycopg.pq import TransactionStatus

from .errors import translate

if TYPE_CHECKING:
    from .connections import PostgresConnections

_INTRANS = TransactionStatus.INTRANS
_INERROR = TransactionStatus.INERROR
_IDLE = TransactionStatus.IDLE


class PostgresSession:
    """A backend-owned psycopg connection (``Session``): an attempt-counting one, or a lease."""

    __slots__ = ("conn", "session_id", "_dsn")

    def __init__(self, conn: psycopg.Connection[Any], dsn: str):
        self.conn = conn
        self.session_id = int(conn.info.backend_pid)
        self._dsn = dsn

    def alive(self) -> bool:
        conn = self.conn
        return not (conn.closed or conn.broken)

    def close(self) -> None:
        self.conn.close()

    def _run(self, op: Callable[[], Any]) -> Any:
        try:
            return op()
        except psycopg.Error as exc:
            raise translate(exc, self._dsn) from None

    def __enter__(self) -> "PostgresSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never the DSN
        return f"{type(self).__name__}(session_id={self.session_id}, alive={self.alive()})"


class PostgresLease(PostgresSession):
    """A worker slot's lease connection (``Lease``): its transactions are job leases."""

    __slots__ = ("bounded_by_server", "_backend", "q", "_ended", "_pooled", "_xact_start")

    def __init__(self, conn: psycopg.Connection[Any], backend: "PostgresConnections", bounded_by_server: bool):
        super().__init__(conn, backend.dsn)
        self._backend = backend
        self.q = backend.q
        self.bounded_by_server = bounded_by_server
        self._ended = False  # end() was called: not alive, and not lost (ended on purpose)
        self._pooled = backend.pooling.pooled
        self._xact_start: Any = None  # behind a pooler: the current lease transaction's start
        if self._pooled:  # libpq's pid is the pooler's; the server session's, until begin() reads it again
            row = self._run(lambda: conn.execute(self.q["backend_pid"]).fetchone())
            self._run(conn.rollback)
            self.session_id = int(row[0])

    def begin(self) -> None:
        """Directly, nothing to send now: psycopg sends BEGIN just before the transaction's first
        statement (a round trip of its own). Behind a pooler, one statement opens it with the lease's
        bounds and reads its session."""
        if self._pooled:
            started = self._run(lambda: self._backend.begin_lease_transaction(self.conn))
            self.session_id, self._xact_start = started

    def commit(self) -> None:
        try:
            self.conn.commit()
        except psycopg.Error as exc:
            raise translate(exc, self._dsn) from None

    def rollback(self) -> None:
        try:
            self.conn.rollback()
        except psycopg.Error as exc:
            raise translate(exc, self._dsn) from None

    def let_go(self) -> None:
        """COMMIT, not ROLLBACK: the transaction wrote nothing, so both end it alike, but psycopg
        drops every prepared statement of the connection after a ROLLBACK (an object it names may
        have been dropped), and the next claims and finishing writes would be planned anew for their
        first ten runs (see ``with_limit`` in queries.py) -- after every claim that found nothing."""
        self.commit()

    def savepoint(self) -> None:
        """The job's savepoint (see ``savepoint`` in queries.sql: taken only when a handler reads
        ``job.conn``)."""
        self._execute("savepoint")

    def rollback_to_savepoint(self) -> None:
        self._execute("rollback_to_savepoint")

    def release_savepoint(self) -> None:
        self._execute("release_savepoint")

    def _execute(self, name: str) -> None:
        try:
            self.conn.execute(self.q[name])
        except psycopg.Error as exc:
            raise translate(exc, self._dsn) from None

    def in_transaction(self) -> bool:
        conn = self.conn
        return not (self._ended or conn.closed) and conn.info.transaction_status == _INTRANS

    def in_error(self) -> bool:
        conn = self.conn
        return not (self._ended or conn.closed) and conn.info.transaction_status == _INERROR

    def idle(self) -> bool:
        return self.alive() and self.conn.info.transaction_status == _IDLE

    def alive(self) -> bool:
        conn = self.conn
        return not (self._ended or conn.closed or conn.broken)

    def lost(self) -> bool:
        return not self._ended and bool(self.conn.broken)

    def end(self) -> None:
        """Terminate the session from another (pooled) connection -- the server rolls its transaction
        back -- then close this connection. A lease already gone is only closed. From the call on, the
        lease is neither alive nor lost (it was ended on purpose), whichever thread looks."""
        self._ended = True
        try:
            if not self.conn.closed and self._pooled:
                if self._xact_start is not None and self.conn.info.transaction_status != _IDLE:
                    self._backend._all("end_lease_transaction", {"pid": self.session_id, "xact_start": self._xact_start})
            elif not self.conn.closed:
                self._backend.terminate([self.session_id])
        finally:
            self.conn.close()


# A task's timeout on the server (``set_local_timeouts`` in queries.sql): what ends the session of a
# handler stuck outside the database comes this much later than the worker's own timer, so the
# worker records the timeout first and the server's bound stays the backstop for a stuck process.
SESSION_TIMEOUT_MARGIN = 1.0


def local_timeouts(seconds: float) -> tuple[str, str]:
    """A task's ``timeout`` as the server's settings: (statement_timeout, the session-ending
    idle_in_transaction_session_timeout / transaction_timeout, ``SESSION_TIMEOUT_MARGIN`` later)."""
    return f"{max(1, int(seconds * 1000))}ms", f"{max(1, int((seconds + SESSION_TIMEOUT_MARGIN) * 1000))}ms"
