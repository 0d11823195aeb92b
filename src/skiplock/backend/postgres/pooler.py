"""A connection pooler (PgBouncer, or another) between skiplock and PostgreSQL: detected, and what
skiplock changes behind one (docs/deployment.md, "PgBouncer and poolers").

Detection (:func:`detect`, once per backend, at its first connection; no setting needed):

- a pooler answers the connection itself, so the backend pid libpq was given at start-up (PgBouncer's
  own cancel key) is not the server session's ``pg_backend_pid()``: **a pooler**;
- then a second connection opens a transaction and the first runs a few more statements: in
  **session** mode each client keeps its server session (the first's statements all on one, the
  second's on another); in **transaction** mode the session the first client just released serves the
  second (PgBouncer reuses the most recently released one), or the first's statements move to other
  sessions. If neither shows, the pooler is taken for a session pooler -- LISTEN is then tried through
  it (NOTIFY is only a hint: idle workers still poll).

What changes behind any pooler (:class:`Pooling`): no prepared statements (``prepare_threshold=None``:
detection can take a busy transaction pooler for a session pooler, never the reverse); the session settings that a direct connection
sends in the ``options`` start-up parameter (which a stock PgBouncer refuses) are not sent; instead
a lease runs at READ COMMITTED by its ``BEGIN`` and sets its bounds (``idle_in_transaction_session_timeout``
and, on PostgreSQL 17+, ``transaction_timeout`` = ``lease_timeout``) with ``SET LOCAL`` at the start of
every lease transaction, and reads its server session's pid there (the session a cancellation ends);
the pooled short operations run at the server's default isolation (a WARNING if that is not READ
COMMITTED); attempt counts commit synchronously; the server-side TCP probes
(``tcp_keepalives_*``, ``tcp_user_timeout``, ``client_connection_check_interval``) are left to the
pooler, whose own settings (``tcp_keepalive``, ``idle_transaction_timeout``) cover the client side.
Behind a **transaction** pooler also no LISTEN through it -- notifications would be lost without an error: LISTEN uses ``direct_dsn`` (a
DSN of the server itself; ``App(direct_dsn=...)`` / ``SKIPLOCK_DIRECT_DSN``) when given, else waiting
falls back to polling. One WARNING says what was found and changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from ...errors import ConfigurationError, redact, redact_dsn

log = logging.getLogger("skiplock.pooler")

DIRECT, SESSION, TRANSACTION = "direct", "session", "transaction"
PROBES = 4  # statements the first client runs while the second holds a transaction (detect)


@dataclass(frozen=True)
class Pooling:
    """How skiplock reaches the server: ``mode`` is DIRECT, SESSION or TRANSACTION (a pooler's pool mode)."""

    mode: str = DIRECT

    @property
    def pooled(self) -> bool:
        """A pooler is in between: no ``options`` start-up parameter, lease settings per transaction."""
        return self.mode != DIRECT

    @property
    def per_transaction(self) -> bool:
        """A transaction pooler: no LISTEN through it."""
        return self.mode == TRANSACTION

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg connection arguments every skiplock connection through this path needs: behind any
        pooler, no prepared statements -- a transaction pooler can pass for a session pooler while
        other clients keep it busy (detect), and a statement prepared on one server session is
        unknown on the next."""
        return {"prepare_threshold": None} if self.pooled else {}


def detect(open_conn: Callable[[], psycopg.Connection[Any]], pid_query: str, dsn: str) -> Pooling:
    """The path to the server, found with two short connections (``open_conn()``: autocommit, no
    ``options``; ``pid_query`` returns ``pg_backend_pid()``). See the module docstring. A pooler that
    refuses a transaction (statement pooling) is a ConfigurationError: a lease is a transaction."""
    first = open_conn()
    try:
        pid = _one(first, pid_query)
        if pid == first.info.backend_pid:
            return Pooling(DIRECT)
        second = open_conn()
        try:
            second.autocommit = False
            try:
                other = _one(second, pid_query)  # holds a transaction, so a server session, until the rollback
            except psycopg.Error as exc:
                raise ConfigurationError(
                    f"PostgreSQL ({redact_dsn(dsn)}) is behind a connection pooler that refused a transaction "
                    f"({redact(' '.join(str(exc).split()), dsn)}): skiplock needs session or transaction pooling "
                    "(statement pooling cannot hold a lease, which is a transaction)") from None
            # a few statements more: on a busy transaction pooler the first client's statements land on
            # whichever server session is free, rarely the same one every time; in session mode, always
            again = {_one(first, pid_query) for _ in range(PROBES)}
            second.rollback()
        finally:
            second.close()
        return Pooling(TRANSACTION if other == pid or again != {pid} else SESSION)
    finally:
        first.close()


def _one(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query, prepare=False).fetchone()
    assert row is not None
    return int(row[0])


def report(pooling: Pooling, dsn: str, direct_dsn: str | None, isolation: str | None) -> None:
    """The one WARNING that says a pooler was found and what skiplock changed for it."""
    if not pooling.pooled:
        return
    changes = ["session settings sent per lease transaction (SET LOCAL) instead of at connection start",
               "server-side TCP probes and client checks left to the pooler",
               "attempt counts committed synchronously", "no prepared statements"]
    if pooling.per_transaction:
        changes.append("LISTEN on direct_dsn " + (f"({redact_dsn(direct_dsn)})" if direct_dsn else
                       "not set: idle workers, relays and waiters poll instead of being woken by NOTIFY "
                       "(set direct_dsn / SKIPLOCK_DIRECT_DSN to a DSN of the server itself)"))
    if isolation is not None and isolation != "read committed":
        changes.append(f"WARNING: the server's default_transaction_isolation is {isolation!r}: short "
                       "operations through the pooler run at it (set it to 'read committed' for skiplock's role)")
    log.warning("PostgreSQL (%s) is behind a %s-pooling connection pooler; skiplock changed: %s",
                redact_dsn(dsn), pooling.mode, "; ".join(changes))


class PollingNotifications:
    """A Notifications (base.py) that never receives any: ``wait(timeout)`` sleeps ``timeout`` seconds
    and returns ``[]`` -- what a listener gets behind a transaction pooler without ``direct_dsn``, so
    every waiter falls back to its polling interval."""

    def __init__(self) -> None:
        import threading

        self._closed = threading.Event()

    def wait(self, timeout: float) -> list[str]:
        self._closed.wait(max(0.0, timeout))
        return []

    def close(self) -> None:
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()
