"""asyncio API: the same core as :class:`skiplock.App`, not a twin implementation.

Every method is written out here with :class:`App`'s parameters and types (mypy and IDEs see them;
tests/unit/test_async_api.py checks they match App's). Each call runs the synchronous core in a
thread (``asyncio.to_thread``), so behaviour and guarantees are identical. The exception is
enqueueing on the caller's asyncio connection (a ``psycopg.AsyncConnection``; on MySQL/MariaDB an
asyncmy or aiomysql connection): the arguments are checked by the same code as App's, and the
statements, retries and errors come from the same steps generators as the sync path
(backend/postgres/steps.py, backend/mysql/steps.py), here driven by the async driver on the caller's connection,
inside the caller's transaction. ``async def`` handlers are supported by the worker itself (each
slot runs them on its own loop).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .observability.reporting import enqueued
from .backend.drivers import is_async_connection
from .app import App, RetriedJobs, Task, _check_unique, _enqueue_steps
from .job import Job, JobState
from .retry import RetryPolicy
from .worker import WorkerStats

if TYPE_CHECKING:
    from .outbox import Outbox


class AsyncApp:
    """``AsyncApp(dsn=...)`` or ``AsyncApp(app=existing_app)``; register tasks with ``@aapp.task``.

    Every method is :class:`App`'s, as a coroutine (``task`` and ``periodic`` register, as App's
    do); see App for what each promises. What configures or builds objects (``configure``,
    ``worker``, ``relay``, ``get_task``, ``dsn``, ``backend``) is on ``aapp.app``; ``run_worker``
    runs a worker from asyncio."""

    def __init__(self, dsn: str | None = None, *, app: App | None = None, **options: Any):
        self.app = app if app is not None else App(dsn, **options)

    # ---- tasks (registration does no I/O: plain methods) ---------------------------------------

    def task(self, name: str | None = None, *, queue: str = "default", priority: int = 0, max_attempts: int = 5,
             retry: RetryPolicy | float | None = None, timeout: float | None = None, lease: str = "transaction",
             lease_seconds: float = 60.0, concurrency: int | None = None, rate: str | None = None,
             partition_by: str | None = None, sequence_by: str | None = None,
             sequence_on_failure: str = "wait") -> Callable[[Callable[..., Any]], Task]:
        """:meth:`App.task` (``async def`` handlers run on the worker's own event loops)."""
        return self.app.task(name, queue=queue, priority=priority, max_attempts=max_attempts, retry=retry,
                             timeout=timeout, lease=lease, lease_seconds=lease_seconds, concurrency=concurrency,
                             rate=rate, partition_by=partition_by, sequence_by=sequence_by,
                             sequence_on_failure=sequence_on_failure)

    def periodic(self, cron: str, *, name: str | None = None, args: Mapping[str, Any] | None = None,
                 timezone: str = "UTC", missed: str = "skip", queue: str = "default", priority: int = 0,
                 max_attempts: int = 5, retry: RetryPolicy | float | None = None, timeout: float | None = None,
                 lease: str = "transaction", lease_seconds: float = 60.0) -> Callable[[Callable[..., Any]], Task]:
        """:meth:`App.periodic`."""
        return self.app.periodic(cron, name=name, args=args, timezone=timezone, missed=missed, queue=queue,
                                 priority=priority, max_attempts=max_attempts, retry=retry, timeout=timeout,
                                 lease=lease, lease_seconds=lease_seconds)

    @property
    def outbox(self) -> "Outbox":
        """The app's transactional outbox: ``await aapp.outbox.put_async(topic, payload, conn=aconn)``."""
        return self.app.outbox

    # ---- schema --------------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """:meth:`App.migrate`."""
        return await asyncio.to_thread(self.app.migrate)

    async def check(self) -> None:
        """:meth:`App.check`."""
        await asyncio.to_thread(self.app.check)

    # ---- producing -----------------------------------------------------------------------------

    async def enqueue(self, task: str, args: Mapping[str, Any] | None = None, *, queue: str | None = None,
                      priority: int | None = None, run_at: datetime | None = None, delay: float | timedelta | None = None,
                      max_attempts: int | None = None, unique_key: str | None = None, on_conflict: str = "return",
                      conn: Any = None, partition: str | None = None, sequence: str | None = None) -> int:
        """:meth:`App.enqueue`; with an asyncio connection (``AsyncConnection``; asyncmy/aiomysql on
        MySQL) the job exists only if the caller commits
        (the same checks, statements, retries and errors as App.enqueue on a connection)."""
        if not is_async_connection(conn):
            return await asyncio.to_thread(
                self.app.enqueue, task, args, queue=queue, priority=priority, run_at=run_at, delay=delay,
                max_attempts=max_attempts, unique_key=unique_key, on_conflict=on_conflict, conn=conn,
                partition=partition, sequence=sequence)
        job = self.app._new_job(task, args, queue, priority, run_at, delay, max_attempts, partition, sequence)
        key = _check_unique(unique_key, on_conflict, job)  # before anything is sent, as App.enqueue
        backend = await asyncio.to_thread(self.app._ready)
        if partition is not None:
            self.app._check_flow_control("a job's partition")
        if job.sequence is not None:
            self.app._check_flow_control("a job's sequence")
        if self.app.tracing is None:
            job_id = await backend.run_async(_enqueue_steps(backend, job, key, on_conflict), conn)
        else:  # the enqueue span, its context kept in the caller's transaction (observability/tracing.py)
            with self.app.tracing.enqueue_async(job.task, job.queue, 1) as keep:
                job_id = await backend.run_async(_enqueue_steps(backend, job, key, on_conflict), conn)
                await keep([job_id], conn)
        if self.app.metrics is not None or self.app.hooks.active:
            enqueued(self.app, [job], [job_id])
        return job_id

    async def enqueue_many(self, jobs: Iterable[tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], Mapping[str, Any]]],
                           *, conn: Any = None) -> list[int]:
        """:meth:`App.enqueue_many` (item options ``unique_key`` and ``on_conflict`` included),
        also on an asyncio connection (``AsyncConnection``; asyncmy/aiomysql on MySQL): the same checks (a bad item is refused by index before
        anything is sent), then the sync path's steps in the caller's transaction -- one INSERT
        statement whatever the batch size (the COPY path of large batches is sync only); with
        unique keys the same undoable attempts (the backend's ``keyed_batch``), so a refusal leaves the
        caller's transaction usable."""
        if not is_async_connection(conn):
            return await asyncio.to_thread(self.app.enqueue_many, jobs, conn=conn)
        new, keyed = self.app._new_jobs(jobs)
        if not new:
            return []
        batch = self.app.backend.keyed_batch(new, keyed) if keyed else None  # in-call duplicates: refused before any I/O
        backend = await asyncio.to_thread(self.app._ready)
        if any(j.partition is not None for j in new):
            self.app._check_flow_control("a job's partition")
        if any(j.sequence is not None for j in new):
            self.app._check_flow_control("a job's sequence")
        steps = backend.enqueue_steps(new) if batch is None else backend.enqueue_keyed_steps(batch)
        if self.app.tracing is None:
            ids = await backend.run_async(steps, conn)
        else:  # one span for the batch, named as App.enqueue_many's
            with self.app.tracing.enqueue_async(new[0].task, new[0].queue, len(new)) as keep:
                ids = await backend.run_async(steps, conn)
                await keep(ids, conn)
        if self.app.metrics is not None or self.app.hooks.active:
            enqueued(self.app, new, ids)
        return ids

    # ---- reading -------------------------------------------------------------------------------

    async def get_job(self, job_id: int) -> Job:
        """:meth:`App.get_job`."""
        return await asyncio.to_thread(self.app.get_job, job_id)

    async def list_jobs(self, *, state: str | None = None, queue: str | None = None, task: str | None = None,
                        limit: int = 50, before: int | None = None) -> list[Job]:
        """:meth:`App.list_jobs`."""
        return await asyncio.to_thread(self.app.list_jobs, state=state, queue=queue, task=task, limit=limit,
                                       before=before)

    async def counts(self) -> list[tuple[str, str, int]]:
        """:meth:`App.counts`."""
        return await asyncio.to_thread(self.app.counts)

    async def live_workers(self) -> int:
        """:meth:`App.live_workers`."""
        return await asyncio.to_thread(self.app.live_workers)

    async def untakeable_jobs(self) -> list[tuple[str, str, int]]:
        """:meth:`App.untakeable_jobs`."""
        return await asyncio.to_thread(self.app.untakeable_jobs)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def cancel_job(self, job_id: int, reason: str = "cancelled by request", wait: float = 10.0) -> JobState:
        """:meth:`App.cancel_job`."""
        return await asyncio.to_thread(self.app.cancel_job, job_id, reason, wait)

    async def retry_job(self, job_id: int) -> None:
        """:meth:`App.retry_job`."""
        await asyncio.to_thread(self.app.retry_job, job_id)

    async def retry_failed(self, queue: str | None = None) -> "RetriedJobs":
        """:meth:`App.retry_failed`."""
        return await asyncio.to_thread(self.app.retry_failed, queue)

    async def set_queue_limits(self, queue: str, *, concurrency: int | None = None, rate: str | None = None,
                               fair: bool = False, weights: Mapping[str, int] | None = None) -> None:
        """:meth:`App.set_queue_limits`."""
        await asyncio.to_thread(self.app.set_queue_limits, queue, concurrency=concurrency, rate=rate, fair=fair,
                                weights=weights)

    async def set_task_limits(self, task: str, *, concurrency: int | None = None, rate: str | None = None,
                              clear: bool = False) -> None:
        """:meth:`App.set_task_limits`."""
        await asyncio.to_thread(self.app.set_task_limits, task, concurrency=concurrency, rate=rate, clear=clear)

    async def task_limits(self) -> list[dict[str, Any]]:
        """:meth:`App.task_limits`."""
        return await asyncio.to_thread(self.app.task_limits)

    async def queue_limits(self) -> list[dict[str, Any]]:
        """:meth:`App.queue_limits`."""
        return await asyncio.to_thread(self.app.queue_limits)

    async def clearing_queue_limits(self) -> list[str]:
        """:meth:`App.clearing_queue_limits`."""
        return await asyncio.to_thread(self.app.clearing_queue_limits)

    async def pause_queue(self, queue: str, *, force: bool = False) -> None:
        """:meth:`App.pause_queue`."""
        await asyncio.to_thread(self.app.pause_queue, queue, force=force)

    async def resume_queue(self, queue: str) -> bool:
        """:meth:`App.resume_queue`."""
        return await asyncio.to_thread(self.app.resume_queue, queue)

    async def queues(self) -> list[dict[str, Any]]:
        """:meth:`App.queues`."""
        return await asyncio.to_thread(self.app.queues)

    async def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """:meth:`App.wait` (the waiting happens in a thread; the event loop stays free)."""
        return await asyncio.to_thread(self.app.wait, job_id, timeout)

    async def prune(self, retention: Mapping[str, float | timedelta] | None = None, batch: int = 1000) -> dict[str, int]:
        """:meth:`App.prune`."""
        return await asyncio.to_thread(self.app.prune, retention, batch)

    # ---- working -------------------------------------------------------------------------------

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

    async def run_async_worker(self, queues: list[str] | None = None, concurrency: int = 100, *,
                               max_connections: int = 10, stop_when_empty: bool = False,
                               poll_interval: float = 0.25, rescue_interval: float = 5.0,
                               schema_check_interval: float = 30.0) -> WorkerStats:
        """Run the asyncio worker (worker/aio_worker.py) on this event loop until stopped: every
        ``async def`` handler runs here, at most ``concurrency`` at once, on at most ``max_connections``
        database connections. Transaction lease: ``job.conn`` is a psycopg ``AsyncConnection`` whose
        transaction is the lease (its writes commit with the job); claimed lease: an in-flight job holds
        no connection (``job.conn`` is None), its lease renewed in batches. Cancelling this coroutine
        stops claiming and lets the jobs in flight finish. Every ``schema_check_interval`` seconds it
        checks the schema version, as the threaded worker does (worker/schema_watch.py). PostgreSQL
        only: on MySQL/MariaDB it raises ConfigurationError (use :meth:`run_worker`). See docs/asyncio.md."""
        from .worker.aio_worker import AsyncWorker

        worker = AsyncWorker(self.app, queues, concurrency, max_connections=max_connections,
                             poll_interval=poll_interval, rescue_interval=rescue_interval,
                             schema_check_interval=schema_check_interval)
        return await worker.run(stop_when_empty=stop_when_empty)

    # ---- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """:meth:`App.close`."""
        await asyncio.to_thread(self.app.close)

    async def __aenter__(self) -> "AsyncApp":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
