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
from .backend import connection_lost, one_line


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
