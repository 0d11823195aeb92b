"""Statement steps: what a write sends and decides, written once, run by a sync and an async driver.

A *steps* generator yields ``(query, params)`` and is sent back the rows that statement returned
(a list of tuples, whatever the caller's row factory); its return value is the operation's result
and the exceptions it raises are the operation's errors. It does no I/O itself, so one generator
serves a ``psycopg.Connection`` (:func:`run`) and a ``psycopg.AsyncConnection`` (:func:`run_async`):
the same statements, the same retries, the same errors -- no twin implementations.

A step may also be :class:`Undoable` (other steps): the driver runs them in a scope whose writes an
exception undoes (:func:`undoable`), then sends back their result, or throws their exception into
the generator, which may catch it (and try again) or let it through.

The outbox's ``_put_steps`` (backend/postgres/outbox.py) is the same idiom.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Generator, Iterator, NamedTuple, TypeVar, Union

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

T = TypeVar("T")
Statement = tuple[str, dict[str, Any]]


class Undoable(NamedTuple):
    """A step made of steps, run in an undoable scope: its writes vanish if it raises."""

    steps: "Steps[Any]"


Step = Union[Statement, Undoable]
Steps = Generator[Step, Any, T]


def run(conn: psycopg.Connection[Any], steps: Steps[T]) -> T:
    """Run ``steps`` on ``conn`` (in its current transaction, or autocommitting each statement)."""
    cur = conn.cursor(row_factory=tuple_row)  # the caller's cursor class, tuples whatever its row factory
    sent: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(sent) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        sent, error = None, None
        if isinstance(step, Undoable):
            try:
                with undoable(conn):
                    sent = run(conn, step.steps)
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                error = exc
        else:
            sent = cur.execute(*step).fetchall()


async def run_async(conn: psycopg.AsyncConnection[Any], steps: Steps[T]) -> T:
    """:func:`run` on an ``AsyncConnection``: the very same steps, awaited."""
    cur = conn.cursor(row_factory=tuple_row)
    sent: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(sent) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        sent, error = None, None
        if isinstance(step, Undoable):
            try:
                async with undoable_async(conn):
                    sent = await run_async(conn, step.steps)
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                error = exc
        else:
            sent = await (await cur.execute(*step)).fetchall()


@contextmanager
def undoable(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A scope on ``conn`` whose writes an exception undoes, and nothing else: a savepoint in its
    open transaction (``conn.transaction()`` nests), a transaction of its own in autocommit mode,
    or -- no transaction open yet -- the one our statements begin, rolled back (it holds nothing of
    the caller's). The caller's transaction is left as it was, usable, whatever went wrong inside."""
    if conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        with conn.transaction():
            yield
        return
    try:
        yield
    except BaseException:
        try:
            conn.rollback()
        except psycopg.Error:
            pass  # a broken connection: the original error says more
        raise


@asynccontextmanager
async def undoable_async(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """:func:`undoable` on an ``AsyncConnection``."""
    if conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        async with conn.transaction():
            yield
        return
    try:
        yield
    except BaseException:
        try:
            await conn.rollback()
        except psycopg.Error:
            pass
        raise
