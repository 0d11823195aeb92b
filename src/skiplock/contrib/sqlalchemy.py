"""skiplock for SQLAlchemy 2 (the ``postgresql+psycopg`` dialect, sync and asyncio): docs/sqlalchemy.md.

Enqueue in the caller's transaction -- the job exists only if the caller commits:

- :func:`enqueue` / :func:`enqueue_many` on a ``Session`` or a ``Connection``;
- :func:`enqueue_async` / :func:`enqueue_many_async` on an ``AsyncSession`` or an ``AsyncConnection``.

A ``Connection`` not yet in a transaction begins one (as its first ``execute`` would: "commit as you
go"), so ``conn.commit()`` commits the job and a rollback or a close without commit discards it.

In a handler (transaction lease), :func:`session` gives a ``Session`` on the job's own connection:
its ORM writes commit with the job's completion, or not at all. The Session joins the lease's
transaction with a savepoint (``join_transaction_mode="create_savepoint"``): ``session.commit()``
releases that savepoint (the writes still commit only with the job), ``session.rollback()`` undoes
the Session's writes alone. Leaving the block flushes and releases it; an exception rolls it back.
Nothing in it can commit, roll back or close the lease itself. Under the claimed lease the Session's
writes commit with the fenced ``done`` write (docs/leases.md: its transaction is open from the first
statement to the end, so write at the end of a long job).
``async def`` handlers on the sync worker (``App.worker()``) get the same sync Session: ``job.conn`` is
a sync connection in them too (the worker runs them on a loop of the slot's thread). On the asyncio
worker (``AsyncApp.run_async_worker``), where ``job.conn`` is an ``AsyncConnection``,
:func:`async_session` gives an ``AsyncSession`` on it, with the same promises.

PostgreSQL-specific by design (tests/unit/test_import_contract.py, DRIVER_BY_DESIGN)."""

from __future__ import annotations

import contextvars
import threading
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Iterator

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..aio import AsyncApp
    from ..app import App
    from ..job import Job


# ---- enqueueing in the caller's transaction -----------------------------------------------------


def _driver_connection(target: Session | Connection) -> "psycopg.Connection[Any]":
    if isinstance(target, Session):
        target = target.connection()  # begins the Session's transaction if it has none
    if not isinstance(target, Connection):
        raise ConfigurationError(f"enqueue needs a SQLAlchemy Session or Connection, got {type(target).__name__} "
                                 "(an AsyncSession or AsyncConnection: enqueue_async)")
    if not target.in_transaction():
        target.begin()
    conn = target.connection.driver_connection
    if not isinstance(conn, psycopg.Connection):
        raise ConfigurationError("skiplock needs the postgresql+psycopg dialect (psycopg 3); this connection is "
                                 f"{type(conn).__module__}.{type(conn).__name__}")
    return conn


async def _async_driver_connection(target: AsyncSession | AsyncConnection) -> "psycopg.AsyncConnection[Any]":
    if isinstance(target, AsyncSession):
        target = await target.connection()
    if not isinstance(target, AsyncConnection):
        raise ConfigurationError(f"enqueue_async needs an AsyncSession or AsyncConnection, got {type(target).__name__} "
                                 "(a Session or Connection: enqueue)")
    if not target.in_transaction():
        await target.begin()
    conn = (await target.get_raw_connection()).driver_connection
    if not isinstance(conn, psycopg.AsyncConnection):
        raise ConfigurationError("skiplock needs the postgresql+psycopg dialect (psycopg 3) with "
                                 f"create_async_engine; this connection is {type(conn).__module__}.{type(conn).__name__}")
    return conn


def _async_app(app: "App | AsyncApp") -> "AsyncApp":
    from ..aio import AsyncApp

    return app if isinstance(app, AsyncApp) else AsyncApp(app=app)


def enqueue(app: "App", target: Session | Connection, task: str, args: Any = None, **options: Any) -> int:
    """``app.enqueue(task, args, **options)`` in ``target``'s transaction."""
    return app.enqueue(task, args, conn=_driver_connection(target), **options)


def enqueue_many(app: "App", target: Session | Connection, jobs: Iterable[Any]) -> list[int]:
    """``app.enqueue_many(jobs)`` in ``target``'s transaction."""
    return app.enqueue_many(jobs, conn=_driver_connection(target))


async def enqueue_async(app: "App | AsyncApp", target: AsyncSession | AsyncConnection, task: str, args: Any = None,
                        **options: Any) -> int:
    """``AsyncApp.enqueue`` in ``target``'s transaction (the same checks and statements as App.enqueue)."""
    conn = await _async_driver_connection(target)
    return await _async_app(app).enqueue(task, args, conn=conn, **options)


async def enqueue_many_async(app: "App | AsyncApp", target: AsyncSession | AsyncConnection,
                             jobs: Iterable[Any]) -> list[int]:
    """``AsyncApp.enqueue_many`` in ``target``'s transaction."""
    conn = await _async_driver_connection(target)
    return await _async_app(app).enqueue_many(jobs, conn=conn)


# ---- a Session on a handler's lease --------------------------------------------------------------

_lease: contextvars.ContextVar["psycopg.Connection[Any] | None"] = contextvars.ContextVar("skiplock_sa_lease",
                                                                                         default=None)
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


class _LeaseConnection:
    """The DBAPI connection SQLAlchemy gets under a lease: the lease's psycopg connection, which
    SQLAlchemy cannot commit, end or close (its rollback when it lets go of the connection is a
    no-op: the lease's outcome is the worker's to write)."""

    def __init__(self, conn: "psycopg.Connection[Any]"):
        self._conn = conn

    def commit(self) -> None:
        raise ConfigurationError("a skiplock handler's Session cannot commit the job's transaction: it commits "
                                 "with the job's completion")

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Any) -> None:
        pass  # the dialect's on-connect: not on skiplock's pooled connection, once per job

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _from_lease() -> _LeaseConnection:
    conn = _lease.get()
    if conn is None:
        raise ConfigurationError("skiplock's lease engine connects only inside skiplock.contrib.sqlalchemy.session(job)")
    return _LeaseConnection(conn)


def _lease_engine(engine: Engine | None) -> Engine:
    """An engine of ``engine``'s URL (its dialect) whose every connection is the current lease's."""
    url = engine.url if engine is not None else "postgresql+psycopg://"
    key = str(url)
    with _engines_lock:
        found = _engines.get(key)
        if found is None:
            # use_native_hstore=False: the dialect would otherwise look the type up and register it on
            # skiplock's pooled connection (hstore columns then come back as text)
            found = _engines[key] = create_engine(url, creator=_from_lease, poolclass=NullPool,
                                                  pool_reset_on_return=None, use_native_hstore=False)
        return found


@contextmanager
def session(job: "Job", *, engine: Engine | None = None, **session_options: Any) -> Iterator[Session]:
    """A ``Session`` on ``job.conn``: its writes commit with the job's finishing write. ``engine``:
    your engine, whose URL (dialect) it uses -- never its pool. ``session_options``: ``Session``'s."""
    lease = job.conn  # takes the job's savepoint
    if lease is None:
        raise ConfigurationError("session(job) is for a running job's handler: this job has no connection")
    if isinstance(lease, psycopg.AsyncConnection):
        raise ConfigurationError("this job's connection is an AsyncConnection (the asyncio worker): use "
                                 "`async with async_session(job) as s:` in an async def handler")
    token = _lease.set(lease)
    try:
        with _lease_engine(engine).connect() as conn:
            conn.begin()  # SQLAlchemy's view of the lease's transaction: never committed by it
            with Session(bind=conn, join_transaction_mode="create_savepoint", **session_options) as s:
                try:
                    yield s
                except BaseException:
                    s.rollback()
                    raise
                s.commit()  # flushed, its savepoint released: commits with the job
    finally:
        _lease.reset(token)


# ---- an AsyncSession on an asyncio-worker handler's lease ----------------------------------------

_async_lease: contextvars.ContextVar["psycopg.AsyncConnection[Any] | None"] = contextvars.ContextVar(
    "skiplock_sa_async_lease", default=None)
_async_engines: dict[str, AsyncEngine] = {}


class _AsyncLeaseConnection:
    """The driver connection SQLAlchemy's asyncio dialect gets under a lease: the lease's psycopg
    ``AsyncConnection``, which SQLAlchemy cannot commit, end or close (as :class:`_LeaseConnection`)."""

    def __init__(self, conn: "psycopg.AsyncConnection[Any]"):
        self._conn = conn

    async def commit(self) -> None:
        raise ConfigurationError("a skiplock handler's AsyncSession cannot commit the job's transaction: it "
                                 "commits with the job's completion")

    async def rollback(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def _from_async_lease() -> Any:
    conn = _async_lease.get()
    if conn is None:
        raise ConfigurationError("skiplock's async lease engine connects only inside "
                                 "skiplock.contrib.sqlalchemy.async_session(job)")
    return _AsyncLeaseConnection(conn)


def _async_lease_engine(engine: AsyncEngine | None) -> AsyncEngine:
    """An async engine of ``engine``'s URL whose every connection is the current lease's."""
    url = engine.url if engine is not None else "postgresql+psycopg://"
    key = str(url)
    with _engines_lock:
        found = _async_engines.get(key)
        if found is None:
            found = _async_engines[key] = create_async_engine(url, async_creator=_from_async_lease,
                                                              poolclass=NullPool, pool_reset_on_return=None,
                                                              use_native_hstore=False)
        return found


@asynccontextmanager
async def async_session(job: "Job", *, engine: AsyncEngine | None = None,
                        **session_options: Any) -> AsyncIterator[AsyncSession]:
    """An ``AsyncSession`` on ``job.conn`` for an ``async def`` handler on the asyncio worker (where
    ``job.conn`` is the lease's ``AsyncConnection``): :func:`session`'s promises, awaited -- its writes
    commit with the job's completion or not at all; it joins the lease's transaction with a savepoint
    (``s.commit()`` releases it, ``s.rollback()`` undoes the session's writes alone); leaving the block
    flushes and releases it, an exception rolls it back; nothing in it can commit, roll back or close
    the lease. ``engine``: your ``AsyncEngine``, whose URL (dialect) it uses -- never its pool."""
    lease = job.conn
    if lease is None:
        raise ConfigurationError("async_session(job) is for a running job's handler: this job has no connection")
    if not isinstance(lease, psycopg.AsyncConnection):
        raise ConfigurationError("async_session(job) needs the asyncio worker's AsyncConnection "
                                 "(AsyncApp.run_async_worker); on App.worker() use `with session(job) as s:`")
    token = _async_lease.set(lease)
    try:
        async with _async_lease_engine(engine).connect() as conn:
            await conn.begin()  # SQLAlchemy's view of the lease's transaction: never committed by it
            async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint", **session_options) as s:
                try:
                    yield s
                except BaseException:
                    await s.rollback()
                    raise
                await s.commit()  # flushed, its savepoint released: commits with the job
    finally:
        _async_lease.reset(token)
