"""asyncio API: the same core as :class:`skiplock.App`, not a twin implementation.

Each call runs the synchronous core in a thread (``asyncio.to_thread``), so behaviour and
guarantees are identical. The exception is enqueueing on the caller's ``psycopg.AsyncConnection``:
that runs the very same statement on the caller's connection, inside the caller's transaction.
``async def`` handlers are supported by the worker itself (each slot runs them on its own loop).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Iterable, Mapping

import psycopg

from .app import App
from .errors import DuplicateJob, InvalidJob
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
        backend = await asyncio.to_thread(self.app._ready)
        if unique_key is None:
            query, params = backend.enqueue_statement([job])
            return (await (await conn.execute(query, params)).fetchone())[0]
        query, params = backend.enqueue_unique_statement(job, unique_key)
        row = await (await conn.execute(query, params)).fetchone()
        if row is None:
            raise InvalidJob(f"the job holding unique_key {unique_key!r} finished meanwhile; enqueue again")
        if not row[1] and on_conflict == "raise":
            raise DuplicateJob(f"job {row[0]} already holds unique_key {unique_key!r}", row[0])
        return row[0]

    async def enqueue_many(self, jobs: Iterable[tuple[Any, ...]], *, conn: Any = None) -> list[int]:
        """As :meth:`App.enqueue_many`, also on an ``AsyncConnection``: the same checks (a bad item is
        refused by index before anything is sent), then one INSERT statement in the caller's
        transaction, whatever the batch size (the COPY path of large batches is sync only)."""
        if not isinstance(conn, psycopg.AsyncConnection):
            return await asyncio.to_thread(functools.partial(self.app.enqueue_many, jobs, conn=conn))
        new = self.app._new_jobs(jobs)
        if not new:
            return []
        backend = await asyncio.to_thread(self.app._ready)
        query, params = backend.enqueue_statement(new)
        return [r[0] for r in await (await conn.execute(query, params)).fetchall()]

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


def _threaded(name: str) -> Callable[..., Any]:
    method = getattr(App, name)

    @functools.wraps(method)
    async def call(self: AsyncApp, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(functools.partial(getattr(self.app, name), *args, **kwargs))

    return call


for _name in THREADED:
    setattr(AsyncApp, _name, _threaded(_name))
