"""The seam's error translation for PyMySQL (and the asyncio drivers' errors, steps.py): the
driver's errors become skiplock's.

- a session that is gone (the client's 2000-range errors: 2003 cannot connect, 2006 server gone
  away, 2013 lost connection; the server's 1927 connection killed, 4031 disconnected for
  inactivity -- MariaDB's idle_transaction_timeout --, 1053 server shutdown; an InterfaceError: the
  connection is closed) -> :class:`~skiplock.errors.ConnectionLost`;
- any other error the server reported on a live session -> :class:`~skiplock.errors.DatabaseError`
  with the MySQL error number as its ``sqlstate`` (a string). 1213 (deadlock: InnoDB rolled the whole
  transaction back) and 1205 (lock wait timeout: only the statement was rolled back) are among them;
  the claim retries both itself (backend.py).

Messages go through ``redact`` with the DSN: no password ever reaches an error.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pymysql

from ...errors import ConnectionLost, DatabaseError, SkiplockError, redact

DEADLOCK = 1213
LOCK_WAIT_TIMEOUT = 1205
SESSION_GONE = frozenset({1053, 1927, 2003, 2006, 2013, 2055, 4031})
RETRYABLE = frozenset({DEADLOCK, LOCK_WAIT_TIMEOUT})


def code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _kinds(exc: BaseException) -> set[str]:
    return {k.__name__ for k in type(exc).__mro__}


def is_driver_error(exc: BaseException) -> bool:
    """An error of PyMySQL (and so of aiomysql, which raises PyMySQL's) or of asyncmy: each derives
    from a ``MySQLError`` of its own (asyncmy's is not PyMySQL's, and the backend imports neither
    asyncio driver: it is given their connections)."""
    return isinstance(exc, pymysql.err.MySQLError) or "MySQLError" in _kinds(exc)


def connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, pymysql.err.InterfaceError) or (is_driver_error(exc) and "InterfaceError" in _kinds(exc)):
        return True
    return code(exc) in SESSION_GONE


def one_line(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    text = str(args[1]) if len(args) > 1 else str(exc)
    text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    number = code(exc)
    return (f"({number}) " if number is not None else "") + (text or type(exc).__name__)


def translate(exc: BaseException, dsn: str | None = None) -> SkiplockError:
    text = f"{type(exc).__name__}: {redact(one_line(exc), dsn)}"
    if connection_lost(exc):
        return ConnectionLost(f"lost the connection to MySQL: {text}")
    number = code(exc)
    return DatabaseError(text, None if number is None else str(number))


@contextmanager
def translated(dsn: str | None = None) -> Iterator[None]:
    """Driver errors raised as skiplock errors, not chained (their attributes may quote the DSN)."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        raise translate(exc, dsn) from None
