"""A sync handler's ``job.conn`` on the asyncio worker: the lease's ``AsyncConnection``, driven from the handler's thread.

The asyncio worker runs a sync handler in a thread (``asyncio.to_thread``) while its lease is a
psycopg ``AsyncConnection`` on the worker's event loop; a handler written for ``App.worker()`` calls
``job.conn.execute(...)`` and expects it done when the call returns. Handing it the AsyncConnection
itself would make that call return a coroutine nobody awaits: the statement would never run and the
job would end ``done`` without its writes. So a sync handler gets a :class:`SyncLease` instead.

Guarantees:

- Its statements run on the lease's ``AsyncConnection``, on the worker's loop, in the job's
  transaction, and each call returns once its statement has run: the handler's writes commit with the
  job's ``done`` or not at all, as on ``App.worker()``.
- Offered: ``execute`` (a cursor with ``fetchone``/``fetchmany``/``fetchall``, iteration, ``rowcount``,
  ``description``, ``statusmessage``), ``cursor()`` (``execute``, ``executemany``, the fetches; a context
  manager), ``transaction()`` (a savepoint; a context manager), ``info`` and ``adapters``. Anything
  else of psycopg's ``Connection`` -- ``commit`` and ``rollback`` included: a handler must leave its
  job's transaction open -- raises ``AttributeError`` saying what to do instead.
- Used from the event loop itself (a sync callable that returned a coroutine, awaited there), it is
  the ``AsyncConnection``, as an ``async def`` handler's ``job.conn`` is.
- Once the handler's run is over (returned, raised, timed out, cancelled), the object is closed: a
  statement from a thread that outlived its run (a timed-out sync handler cannot be stopped) raises
  :class:`~skiplock.errors.ConfigurationError` and never runs in the connection's next transaction.
  The check runs on the event loop, where the run is also ended, so no statement starts after it.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from ..errors import ConfigurationError

T = TypeVar("T")

OFFERED = "execute, cursor, transaction, info and adapters"


class SyncLease:
    """``job.conn`` of a sync handler on the asyncio worker (see the module's docstring)."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop):
        self._conn = conn
        self._loop = loop
        self._open = True

    def end_run(self) -> None:
        """The handler's run is over: no statement of it runs from now on. Called on the loop."""
        self._open = False

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def guarded() -> T:
            if not self._open:
                raise ConfigurationError("this job's run is over (it returned, failed or timed out): its job.conn "
                                         "runs no more statements")
            return await make()

        if self._on_loop():  # blocking the loop on itself would never return
            raise ConfigurationError("a sync cursor of job.conn is for a sync handler's thread, not the event loop")
        return asyncio.run_coroutine_threadsafe(guarded(), self._loop).result()

    def _on_loop(self) -> bool:
        """Called from the worker's event loop itself: a sync callable of the handler returned a
        coroutine that uses ``job.conn`` there, as an AsyncConnection."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        if self._on_loop():
            return self._conn.execute(query, params, **options)
        cursor = self._call(lambda: self._conn.execute(query, params, **options))
        return SyncCursor(self, cursor)

    def cursor(self, *args: Any, **options: Any) -> Any:
        if self._on_loop():
            return self._conn.cursor(*args, **options)
        return SyncCursor(self, self._conn.cursor(*args, **options))

    def transaction(self, savepoint_name: str | None = None, force_rollback: bool = False) -> Any:
        """A savepoint in the job's transaction (psycopg's ``transaction()``): rolled back if the block
        raises, released otherwise."""
        if self._on_loop():
            return self._conn.transaction(savepoint_name, force_rollback)
        return self._transaction(savepoint_name, force_rollback)

    @contextmanager
    def _transaction(self, savepoint_name: str | None, force_rollback: bool) -> Iterator[Any]:
        manager = self._conn.transaction(savepoint_name, force_rollback)
        entered = self._call(manager.__aenter__)
        try:
            yield entered
        except BaseException as exc:
            if not self._call(lambda: manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._call(lambda: manager.__aexit__(None, None, None))

    @property
    def info(self) -> Any:
        return self._conn.info

    @property
    def adapters(self) -> Any:
        return self._conn.adapters

    def __getattr__(self, name: str) -> Any:
        if name != "_conn" and self._on_loop():
            return getattr(self._conn, name)
        raise AttributeError(f"job.conn of a sync handler on the asyncio worker offers {OFFERED}, not {name!r}"
                             " (a handler leaves its job's transaction open): make the handler `async def` (job.conn "
                             "is then the AsyncConnection itself) or run it on App.worker()")


class SyncCursor:
    """A cursor of :class:`SyncLease`: psycopg's ``AsyncCursor``, each call run on the worker's loop."""

    def __init__(self, lease: SyncLease, cursor: Any):
        self._lease = lease
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None, **options: Any) -> "SyncCursor":
        self._lease._call(lambda: self._cursor.execute(query, params, **options))
        return self

    def executemany(self, query: Any, params_seq: Any, **options: Any) -> None:
        self._lease._call(lambda: self._cursor.executemany(query, params_seq, **options))

    def fetchone(self) -> Any:
        return self._lease._call(self._cursor.fetchone)

    def fetchmany(self, size: int = 0) -> list[Any]:
        return self._lease._call(lambda: self._cursor.fetchmany(size))

    def fetchall(self) -> list[Any]:
        return self._lease._call(self._cursor.fetchall)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def statusmessage(self) -> str | None:
        return self._cursor.statusmessage  # type: ignore[no-any-return]

    def close(self) -> None:
        self._lease._call(self._cursor.close)

    def __enter__(self) -> "SyncCursor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
