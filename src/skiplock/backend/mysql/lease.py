"""The MySQL lease: a worker slot's PyMySQL connection behind the port's ``Lease`` (base.py).

``conn`` is the PyMySQL connection itself, what a handler sees as ``job.conn``: a DB-API connection
whose cursors take ``%s`` placeholders (``cur = job.conn.cursor(); cur.execute("insert … values (%s)",
(a,))``), as psycopg's do, so a handler written that way runs on both backends. Its writes commit with
the job's ``done`` in the lease transaction.

Every method raises only skiplock errors (errors.translate). MySQL has no aborted-transaction state
(a refused statement leaves the rest of the transaction in place, except a deadlock, 1213, after
which InnoDB has rolled all of it back), so the lease keeps one: once skiplock's statement on it was
refused, the lease is ``in_error`` (and not ``in_transaction``) until ``rollback`` -- the worker then
only rolls back, as on PostgreSQL, never commits a transaction that lost a statement.

Server bounds (``bounded_by_server``): False. MariaDB's ``idle_transaction_timeout`` (set on every
lease session to ``lease_timeout``) ends a lease left idle in its transaction, but neither MySQL nor
MariaDB ends a transaction open past a task's ``timeout`` while a statement or the handler runs, so
the worker's watchdog ends over-long leases with ``end()`` (KILL from another session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pymysql
from pymysql.constants import SERVER_STATUS

from ...errors import ConnectionLost
from .errors import translate

if TYPE_CHECKING:
    from .connections import MySQLConnections

_IN_TRANS = SERVER_STATUS.SERVER_STATUS_IN_TRANS


class MySQLSession:
    """A backend-owned PyMySQL connection (``Session``): an attempt-counting one, or a lease."""

    __slots__ = ("conn", "session_id", "_dsn", "_closed")

    def __init__(self, conn: Any, dsn: str):
        self.conn = conn
        self.session_id = int(conn.thread_id())
        self._dsn = dsn
        self._closed = False

    def alive(self) -> bool:
        return not self._closed and bool(self.conn.open)

    def close(self) -> None:
        self._closed = True
        try:
            self.conn.close()
        except pymysql.err.Error:
            pass  # already closed

    def __enter__(self) -> "MySQLSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never the DSN
        return f"{type(self).__name__}(session_id={self.session_id}, alive={self.alive()})"


class MySQLLease(MySQLSession):
    """A worker slot's lease connection (``Lease``): its transactions are job leases."""

    __slots__ = ("bounded_by_server", "_backend", "q", "_ended", "refused")

    def __init__(self, conn: Any, backend: "MySQLConnections"):
        super().__init__(conn, backend.dsn)
        self._backend = backend
        self.q = backend.q
        self.bounded_by_server = False
        self._ended = False
        self.refused = False  # a statement of skiplock's was refused in this transaction

    def _call(self, op: Any, *args: Any) -> Any:
        try:
            return op(*args)
        except pymysql.err.MySQLError as exc:
            error = translate(exc, self._dsn)
            if not isinstance(error, ConnectionLost):
                self.refused = True
            raise error from None

    def begin(self) -> None:
        """BEGIN, so ``in_transaction`` is true from here (autocommit is off: the claim would open the
        transaction implicitly too)."""
        self.refused = False
        self._call(self.conn.begin)

    def commit(self) -> None:
        self._call(self.conn.commit)
        self.refused = False

    def rollback(self) -> None:
        self._call(self.conn.rollback)
        self.refused = False

    def let_go(self) -> None:
        self.rollback()

    def _execute(self, name: str) -> None:
        def run() -> None:
            with self.conn.cursor() as cur:
                cur.execute(self.q[name])
        self._call(run)

    def savepoint(self) -> None:
        self._execute("savepoint")

    def rollback_to_savepoint(self) -> None:
        self._execute("rollback_to_savepoint")

    def release_savepoint(self) -> None:
        self._execute("release_savepoint")

    def in_transaction(self) -> bool:
        return self.alive() and not self.refused and bool(self.conn.server_status & _IN_TRANS)

    def in_error(self) -> bool:
        return self.alive() and self.refused  # a lease is never in autocommit: a transaction is open

    def idle(self) -> bool:
        return self.alive() and not (self.conn.server_status & _IN_TRANS)

    def alive(self) -> bool:
        return not (self._ended or self._closed) and bool(self.conn.open)

    def lost(self) -> bool:
        return not (self._ended or self._closed) and not self.conn.open

    def end(self) -> None:
        """KILL the session from another (pooled) connection -- the server rolls its transaction
        back -- then close this connection. From the call on, neither alive nor lost."""
        self._ended = True
        try:
            if self.conn.open:
                self._backend.terminate([self.session_id])
        finally:
            self.close()
