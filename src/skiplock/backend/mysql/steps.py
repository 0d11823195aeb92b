"""Statement steps on MySQL/MariaDB: what a write sends and decides, written once, run by a sync
driver (PyMySQL: :func:`run`) and an asyncio one (asyncmy or aiomysql: :func:`run_async`).

As on PostgreSQL (backend/postgres/steps.py), a *steps* generator does no I/O. It yields

- a :class:`Statement` and is sent back its :class:`Result` -- the rows (tuples, whatever the
  caller's cursor class), the affected row count and ``LAST_INSERT_ID()`` (MySQL has no
  ``RETURNING``: the ids of an INSERT come from the last one);
- :data:`OWN_TRANSACTION` and is sent back whether the connection is in autocommit mode with no
  transaction open, so that the steps ``BEGIN``/``COMMIT`` a transaction of their own where one call
  must be atomic (a caller's transaction is never committed, nor begun a second time).

A statement the server refuses is thrown into the generator as skiplock's error (``fail``: already
translated, never the driver's -- whose attributes may quote the DSN); the steps may undo their part
(a ``ROLLBACK TO SAVEPOINT``) and let it through. A BaseException (KeyboardInterrupt, a cancelled
task) is not thrown in: the connection's state is then unknown and the caller's to discard. One
generator, two drivers: the same statements, the same retries, the same errors.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Generator, NamedTuple, TypeVar

import pymysql

from .errors import is_driver_error

T = TypeVar("T")
_IN_TRANS = pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS


class Statement(NamedTuple):
    """One statement: ``%s`` placeholders with a sequence, or ``%(name)s`` with a mapping."""

    sql: str
    params: Any = None


class Result(NamedTuple):
    rows: list[tuple[Any, ...]]
    rowcount: int
    lastrowid: int | None


class _OwnTransaction:
    def __repr__(self) -> str:
        return "OWN_TRANSACTION"


OWN_TRANSACTION = _OwnTransaction()
Steps = Generator[Any, Any, T]
Fail = Callable[[BaseException], Exception]


def undo(*statements: Statement) -> Steps[None]:
    """Send each of ``statements`` (a rollback), ignoring their refusals: the error being handled says
    more than a failed rollback on a broken connection."""
    for statement in statements:
        try:
            yield statement
        except Exception:  # noqa: BLE001 - see the docstring
            pass


def _own(conn: Any) -> bool:
    """Autocommit, no transaction open: what PyMySQL, asyncmy and aiomysql all say without I/O."""
    status = getattr(conn, "get_transaction_status", None)
    in_transaction = status() if status is not None else bool(conn.server_status & _IN_TRANS)
    return bool(conn.get_autocommit()) and not in_transaction


def _tuples(rows: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows or ()]


def run(conn: Any, steps: Steps[T], fail: Fail) -> T:
    """Run ``steps`` on a PyMySQL connection, in its transaction (or autocommitting each statement)."""
    cur = conn.cursor(pymysql.cursors.Cursor)  # tuples, whatever the caller's cursor class
    sent: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                step = steps.send(sent) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            sent, error = None, None
            if step is OWN_TRANSACTION:
                sent = _own(conn)
                continue
            try:
                cur.execute(step.sql, step.params)
                sent = Result(_tuples(cur.fetchall() if cur.description else ()), cur.rowcount, cur.lastrowid)
            except pymysql.err.MySQLError as exc:
                error = fail(exc)
    finally:
        try:
            cur.close()
        except pymysql.err.MySQLError:
            pass  # a lost connection: the result, or its error, says more


async def run_async(conn: Any, steps: Steps[T], fail: Fail) -> T:
    """:func:`run` on an asyncio connection (asyncmy's, or aiomysql's): the very same steps, awaited.
    The cursor is closed unless a BaseException (a cancelled task) interrupted a statement: the
    connection's protocol state is then unknown, and reading on would not end."""
    cur = conn.cursor()
    if inspect.isawaitable(cur):  # aiomysql: ``await conn.cursor()``
        cur = await cur
    try:
        result = await _drive_async(conn, cur, steps, fail)
    except Exception:
        await _close(cur)
        raise
    await _close(cur)
    return result


async def _drive_async(conn: Any, cur: Any, steps: Steps[T], fail: Fail) -> T:
    sent: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(sent) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        sent, error = None, None
        if step is OWN_TRANSACTION:
            sent = _own(conn)
            continue
        try:
            await cur.execute(step.sql, step.params)
            rows: Any = ()
            if cur.description:
                rows = cur.fetchall()
                if inspect.isawaitable(rows):  # aiomysql's fetchall returns a future
                    rows = await rows
            sent = Result(_tuples(rows), cur.rowcount, cur.lastrowid)
        except Exception as exc:  # noqa: BLE001 - only the driver's errors, the rest re-raised
            if not is_driver_error(exc):
                raise
            error = fail(exc)


async def _close(cur: Any) -> None:
    try:
        closed = cur.close()
        if inspect.isawaitable(closed):
            await closed
    except Exception as exc:  # noqa: BLE001 - a lost connection: the result, or its error, says more
        if not is_driver_error(exc):
            raise
