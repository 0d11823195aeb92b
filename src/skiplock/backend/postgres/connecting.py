"""Opening one PostgreSQL connection: a bounded wait, READ COMMITTED, a supported server, errors without the password.

Guarantees:

- Every connection skiplock opens waits at most ``connect_timeout`` (libpq's, whole seconds, at least 2;
  a DSN's own ``connect_timeout`` wins) and fails with :class:`~skiplock.errors.DatabaseUnavailable`
  naming the server -- never its password, even where libpq's own message quotes the DSN.
- Its transactions run at READ COMMITTED whatever the database's or role's default (``session_options``):
  the claim protocol relies on it.
- A server older than ``MIN_SERVER_VERSION`` is refused at once, with one line naming the version found
  and the one needed (:class:`~skiplock.errors.ConfigurationError`), at no extra round trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

from ...errors import ConfigurationError, DatabaseUnavailable, redact, redact_dsn
from .errors import one_line

DEFAULT_CONNECT_TIMEOUT = 5.0
CONNECT_TIMEOUT = 10  # the libpq connect_timeout of code that passes no timeout (kept for callers)
# libpq-side TCP settings (ignored on Unix sockets).
CLIENT_TCP = dict(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3, tcp_user_timeout=30000)


# Every session skiplock opens runs its transactions at READ COMMITTED, whatever the database's or
# role's default_transaction_isolation: the claim protocol (FOR UPDATE SKIP LOCKED, guarded writes
# that re-check the row's state) relies on it; at REPEATABLE READ or SERIALIZABLE a claim or a
# finishing write would fail with serialization errors wherever rows changed under the snapshot.
READ_COMMITTED = r"-c default_transaction_isolation=read\ committed"


def session_options(dsn: str, *settings: str) -> str:
    """The ``options`` startup parameter for a skiplock session: the DSN's own options, then
    READ COMMITTED and ``settings`` (later ones win)."""
    try:
        given = str(pg_conninfo.conninfo_to_dict(dsn).get("options") or "")
    except psycopg.ProgrammingError:
        given = ""
    return " ".join(x for x in (given, READ_COMMITTED, *settings) if x)


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages (see :func:`skiplock.errors.redact_dsn`)."""
    return redact_dsn(dsn)


def with_connect_timeout(dsn: str, seconds: float | None = None) -> dict[str, Any]:
    """A bounded connect wait (``seconds``, rounded up to libpq's whole seconds, at least 2; default
    CONNECT_TIMEOUT), unless the DSN sets its own."""
    try:
        given = pg_conninfo.conninfo_to_dict(dsn).get("connect_timeout")
    except psycopg.ProgrammingError:
        given = None
    if given:
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT if seconds is None else max(2, math.ceil(seconds))}


# The oldest PostgreSQL skiplock runs on (server_version_num). 15 is the oldest server the test suite
# runs on (tests/pg15_server.py; 18.6 is the newest) and the oldest still supported by the PostgreSQL
# project (13 and 14 reached end of life in November 2025 and 2026). 14 would also lack nothing but
# the tests; 13 lacks client_connection_check_interval, which every lease session sets.
MIN_SERVER_VERSION = 150000


def _major(version: int) -> str:
    return f"{version // 10000}.{version % 10000}" if version >= 100000 else f"{version // 10000}.{version // 100 % 100}"


def check_server_version(conn: psycopg.Connection[Any], dsn: str) -> None:
    """Refuse a server older than MIN_SERVER_VERSION (closing ``conn``) with one line naming the version
    found and the one needed. Costs no round trip: libpq has the version from the connection's start."""
    version = int(conn.info.server_version)
    if version < MIN_SERVER_VERSION:
        conn.close()
        raise ConfigurationError(f"PostgreSQL {_major(version)} at {redact_dsn(dsn)} is not supported: skiplock "
                                 f"needs PostgreSQL {MIN_SERVER_VERSION // 10000} or newer")


def connect(dsn: str, timeout: float | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
    """psycopg.connect with a bounded wait (see :func:`with_connect_timeout`) and a clear error
    naming the server -- never its password (libpq's own message may quote the DSN: it is redacted too).
    A server older than MIN_SERVER_VERSION is refused (:func:`check_server_version`)."""
    try:
        conn = psycopg.connect(dsn, **with_connect_timeout(dsn, timeout), **kwargs)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(f"invalid DSN ({redact_dsn(dsn)}): {redact(one_line(exc), dsn)}") from None
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): "
                                  f"{redact(one_line(exc), dsn)}") from None
    check_server_version(conn, dsn)
    return conn


@dataclass(frozen=True)
class ConnectionBudget:
    """What the server allows this role on this database now (see ``connection_budget`` in
    queries.sql): each applicable limit with the sessions counted against it."""

    max_connections: int
    reserved: int  # superuser_reserved_connections + reserved_connections
    in_use: int
    role_limit: int  # -1: none (or a superuser)
    role_in_use: int
    db_limit: int
    db_in_use: int
    role: str
    database: str

    def available(self) -> tuple[int, str]:
        """(sessions that can still be opened, the limit that decides it, in words)."""
        limits = [(self.max_connections - self.reserved - self.in_use,
                   f"server max_connections {self.max_connections} less {self.reserved} reserved, {self.in_use} in use")]
        if self.role_limit >= 0:
            limits.append((self.role_limit - self.role_in_use,
                           f"role {self.role!r} CONNECTION LIMIT {self.role_limit}, {self.role_in_use} in use"))
        if self.db_limit >= 0:
            limits.append((self.db_limit - self.db_in_use,
                           f"database {self.database!r} CONNECTION LIMIT {self.db_limit}, {self.db_in_use} in use"))
        free, why = min(limits)
        return max(0, free), why


def row_of(cur: Any) -> Any:
    """The one row a statement always returns (a CTE ending in an aggregate or a SELECT of values)."""
    row = cur.fetchone()
    if row is None:
        raise RuntimeError("a statement that always returns a row returned none")
    return row
