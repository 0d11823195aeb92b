"""The seam's error translation: psycopg's errors become skiplock's, so nothing above the backend
catches (or imports) the driver's exception types.

- a session that is gone (``connection_lost``: SQLSTATE class 08, an admin shutdown, a server-side
  idle/transaction timeout, no SQLSTATE at all) -> :class:`skiplock.errors.ConnectionLost`;
- any other error the server reported on a live session -> :class:`skiplock.errors.DatabaseError`
  with its ``sqlstate`` (the session is usable after a rollback).

Messages go through ``redact`` with the DSN: no password ever reaches an error.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import psycopg

from ...errors import ConnectionLost, DatabaseError, SkiplockError, redact

# Errors after which a connection is gone: the network or server failed, or the server ended the
# session itself (idle-in-transaction and transaction timeouts arrive as InternalError).
CONNECTION_LOST: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.errors.IdleInTransactionSessionTimeout,
    psycopg.errors.TransactionTimeout,
)


def session_gone(exc: BaseException) -> bool:
    """Of the CONNECTION_LOST errors, those that mean the session is gone -- not an error the server
    reported on a live session that psycopg also files under OperationalError (a deadlock, a
    serialization failure, a cancelled statement)."""
    if isinstance(exc, (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.errors.TransactionTimeout)):
        return True
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in SESSION_ENDED


# SQLSTATEs of a session the server ended: admin shutdown (pg_terminate_backend), crash shutdown,
# cannot connect now, database dropped, idle_session_timeout.
SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05"})


def connection_lost(exc: BaseException) -> bool:
    """True if ``exc`` means the connection's session is gone (reconnect, record elsewhere); False for
    an error the server reported on a live session (a deadlock, a serialization failure, a cancelled
    statement): that is an error of the statement, to record or retry, and the connection is usable
    after a rollback."""
    return isinstance(exc, CONNECTION_LOST) and session_gone(exc)


def one_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text or type(exc).__name__




UNIQUE_VIOLATION = "23505"  # the SQLSTATE of a unique index refusing a row (DatabaseError.sqlstate)


def translate(exc: psycopg.Error, dsn: str | None = None) -> SkiplockError:
    """The skiplock error for a driver error (see the module docstring)."""
    text = f"{type(exc).__name__}: {redact(one_line(exc), dsn)}"
    if connection_lost(exc):
        return ConnectionLost(f"lost the connection to PostgreSQL: {text}")
    return DatabaseError(text, getattr(exc, "sqlstate", None))


@contextmanager
def translated(dsn: str | None = None) -> Iterator[None]:
    """Run a block with driver errors raised as skiplock errors. The driver's error is not chained
    (``from None``): its text is in the message, redacted; its own attributes may quote the DSN."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, dsn) from None
