"""A LISTEN connection as the port's :class:`~skiplock.backend.base.Notifications`: payloads in, only
skiplock errors out.

``wait(timeout)`` returns as soon as a notification arrives (every payload of the packet it came in),
or ``[]`` after ``timeout`` seconds. A dead connection raises
:class:`~skiplock.errors.ConnectionLost` (TCP keepalives bound how long the death takes to notice);
any other driver error :class:`~skiplock.errors.DatabaseError`. Messages are redacted (no password).

Deliberately free of ``backend.py`` (which opens these connections): no import cycle.
"""

from __future__ import annotations

from typing import Any, Iterator

import psycopg

from ...errors import ConnectionLost, DatabaseError, SkiplockError, redact


class PostgresNotifications:
    """The notifications of one autocommit connection that has run ``LISTEN``."""

    def __init__(self, conn: psycopg.Connection[Any], dsn: str | None = None):
        self._conn = conn
        self._dsn = dsn

    def wait(self, timeout: float) -> list[str]:
        try:
            return [note.payload for note in self._conn.notifies(timeout=max(0.0, timeout), stop_after=1)]
        except psycopg.Error as exc:
            raise self._translate(exc) from None

    def close(self) -> None:
        self._conn.close()

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    def _translate(self, exc: psycopg.Error) -> SkiplockError:
        text = " ".join(str(exc).split()) or type(exc).__name__
        text = f"{type(exc).__name__}: {redact(text, self._dsn)}"
        if self._conn.broken or self._conn.closed or isinstance(exc, psycopg.OperationalError):
            return ConnectionLost(f"lost the LISTEN connection to PostgreSQL: {text}")
        return DatabaseError(text, getattr(exc, "sqlstate", None))
