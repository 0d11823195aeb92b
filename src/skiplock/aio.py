"""asyncio API: the same core as :class:`skiplock.App`, not a twin implementation.

Each call runs the synchronous core in a thread (``asyncio.to_thread``), so behaviour and
guarantees are identical. The exception is enqueueing on the caller's ``psycopg.AsyncConnection``:
that runs the very same statement on the caller's connection, inside the caller's transaction.
``async def`` handlers are supported by the worker itself (each slot runs them on its own loop).
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from .app import App, _check_unique
from .backend.postgres.backend import KEYED_ATTEMPTS, HolderGone, KeyedBatch, PostgresBackend
from .errors import DatabaseUnavailable, DuplicateJob, InvalidJob
from .worker import WorkerStats

# App methods exposed as coroutines, unchanged in signature and meaning.
THREADED = ("migrate", "check", "get_job", "list_jobs", "counts", "cancel_job", "retry_job", "retry_failed",
            "pause_queue", "resume_queue", "queues", "wait", "prune", "close")


class AsyncApp:
    """``AsyncApp(dsn=...)`` or ``AsyncApp(app=existing_app)``; register tasks with ``@aapp.task``."""

    def __init__(self, dsn: str | None = None, *, app: App | None = None, **options: Any):
        self.app = app if app is not None else App(dsn, **options)
        self.task = self.app.task
        self.periodic = self.app.periodic

    @property
    def outbox(self) -> Any:
        """The app's transactional outbox: ``await aapp.outbox.put_async(topic, payload, conn=aconn)``."""
        return self.app.outbox

    async def enqueue(self, task: str, args: Mapping[str, Any] | None = None, *, conn: Any = None,
                      **options: Any) -> int:
        """As :meth:`App.enqueue`; with an ``AsyncConnection`` the job exists only if the caller commits."""
        if not isinstance(conn, psycopg.AsyncConnection):
            return await asyncio.to_thread(functools.partial(self.app.enqueue, task, args, conn=conn, **options))
        unique_key = options.pop("unique_key", None)
        on_conflict = options.pop("on_conflict", "return")
        job = self.app._new_job(task, args, options.pop("queue", None), options.pop("priority", None),
                                options.pop("run_at", None), options.pop("delay", None),
                                options.pop("max_attempts", None))
        if options:
            raise InvalidJob(f"unknown enqueue options {sorted(options)}")
        unique_key = _check_unique(unique_key, on_conflict)  # before anything is sent, as App.enqueue
        backend = await asyncio.to_thread(self.app._ready)
        if unique_key is None:
            query, params = backend.enqueue_statement([job])
            row = await (await conn.cursor(row_factory=tuple_row).execute(query, params)).fetchone()
            return int(row[0])  # type: ignore[index]
        query, params = backend.enqueue_unique_statement(job, unique_key)
        for _ in range(KEYED_ATTEMPTS):  # no row: the holder finished between conflict and lookup (nothing inserted)
            row = await (await conn.cursor(row_factory=tuple_row).execute(query, params)).fetchone()
            if row is not None:
                break
        else:
            raise DatabaseUnavailable(f"unique_key {unique_key!r} kept changing hands; try again")
        if not row[1] and on_conflict == "raise":
            raise DuplicateJob(f"job {row[0]} already holds unique_key {unique_key!r}", row[0])
        return row[0]

    async def enqueue_many(self, jobs: Iterable[tuple[Any, ...]], *, conn: Any = None) -> list[int]:
        """As :meth:`App.enqueue_many` (item options ``unique_key`` and ``on_conflict`` included),
        also on an ``AsyncConnection``: the same checks (a bad item is refused by index before
        anything is sent), then one INSERT statement in the caller's transaction, whatever the batch
        size (the COPY path of large batches is sync only). With unique keys, the same statements
        and decisions as the sync path (:class:`KeyedBatch`), the insert undone on a refusal so the
        caller's transaction stays usable."""
        if not isinstance(conn, psycopg.AsyncConnection):
            return await asyncio.to_thread(functools.partial(self.app.enqueue_many, jobs, conn=conn))
        new, keyed = self.app._new_jobs(jobs)
        if not new:
            return []
        batch = KeyedBatch(new, keyed) if keyed else None
        backend = await asyncio.to_thread(self.app._ready)
        if batch is not None:
            return await _enqueue_keyed(backend, batch, conn)
        query, params = backend.enqueue_statement(new)
        cur = conn.cursor(row_factory=tuple_row)  # whatever the caller's row factory
        return [r[0] for r in await (await cur.execute(query, params)).fetchall()]

    async def run_worker(self, queues: list[str] | None = None, concurrency: int = 4, *,
                         stop_when_empty: bool = False, **options: Any) -> WorkerStats:
        """Run a worker until stopped (cancelling this coroutine stops it gracefully)."""
        worker = self.app.worker(queues=queues, concurrency=concurrency, handle_signals=False, **options)
        future = asyncio.ensure_future(asyncio.to_thread(worker.run, stop_when_empty=stop_when_empty))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            worker.stop()
            await future
            raise

    async def __aenter__(self) -> "AsyncApp":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.app.close)


async def _enqueue_keyed(backend: PostgresBackend, batch: KeyedBatch, conn: psycopg.AsyncConnection[Any]) -> list[int]:
    """:meth:`PostgresBackend.enqueue_keyed` on an AsyncConnection: the same attempts, each undoable."""
    for _ in range(KEYED_ATTEMPTS):
        try:
            async with _undoable(conn):
                cur = conn.cursor(row_factory=tuple_row)
                lookup = batch.inserted(backend, await (await cur.execute(*batch.insert(backend))).fetchall())
                if lookup is not None:
                    batch.looked_up(await (await cur.execute(*lookup)).fetchall())
                return batch.ids()
        except HolderGone:
            continue
    raise batch.gave_up()


@asynccontextmanager
async def _undoable(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """:meth:`PostgresBackend._undoable` for the caller's AsyncConnection: a savepoint in its open
    transaction, a transaction of its own in autocommit mode, or -- none open yet -- the one our
    statements begin, rolled back on error."""
    if conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        async with conn.transaction():
            yield
    else:
        try:
            yield
        except BaseException:
            try:
                await conn.rollback()
            except psycopg.Error:
                pass
            raise


def _threaded(name: str) -> Callable[..., Any]:
    method = getattr(App, name)

    @functools.wraps(method)
    async def call(self: AsyncApp, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(functools.partial(getattr(self.app, name), *args, **kwargs))

    return call


for _name in THREADED:
    setattr(AsyncApp, _name, _threaded(_name))
