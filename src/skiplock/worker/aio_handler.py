"""Calling a handler on the asyncio worker's event loop and turning what happened into an outcome
value (nothing is written here; the same outcome values and failure decisions as the sync worker's
handler.py and failures.py).

- An ``async def`` handler runs as a task on the worker's one event loop; a sync handler runs in a
  thread (``asyncio.to_thread``), so it cannot block the loop. Under the transaction lease a sync
  handler's ``job.conn`` is a sync facade of the lease's ``AsyncConnection`` (aio_sync_conn.py): its
  statements run when called, in the job's transaction, and none runs once its run is over.
- A task ``timeout`` is enforced with ``asyncio.wait_for``: past it the coroutine is cancelled (a
  sync handler's thread cannot be stopped: the worker stops waiting for it) and the attempt fails
  with ``JobTimeout``, retried by the task's policy like any failure.
- Every exception a handler raises is an outcome, even a BaseException; a result jsonb cannot hold
  fails the attempt with ``ResultNotStorable``. ``Snooze``, ``Cancel`` and ``Retry`` mean what they
  mean in the sync worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

from ..job import Cancel, Cancelled, Done, Job, JobState, Outcome, Snooze, Snoozed
from ..values import to_json
from .aio_sync_conn import SyncLease
from .failures import ResultNotStorable, decide_failure, format_error
from .handler import JobTimeout

if TYPE_CHECKING:
    from ..app import App, Task
    from ..backend.base import ClaimedJob


def make_async_job(claimed: "ClaimedJob", attempt: int, worker: str, conn: Any) -> Job:
    """The ``Job`` an asyncio-worker handler gets: ``job.conn`` is the lease's ``AsyncConnection``
    (transaction lease) or None (claimed lease: an in-flight job holds no connection)."""
    return Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
               priority=claimed.priority, state=JobState.RUNNING, attempts=attempt,
               max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
               started_at=claimed.claimed_at, worker=worker, _conn=conn)


async def _invoke(task: "Task", job: Job) -> Any:
    if inspect.iscoroutinefunction(task.fn):
        result = await task.fn(job, **job.args)
    elif job._conn is None:
        result = await asyncio.to_thread(task.fn, job, **job.args)
    else:  # a sync handler under the transaction lease: a sync job.conn on the lease (aio_sync_conn.py)
        lease = SyncLease(job._conn, asyncio.get_running_loop())
        try:
            sync_job = dataclasses.replace(job, _conn=lease)  # type: ignore[arg-type]  # job.conn typed as the sync worker's
            result = await asyncio.to_thread(task.fn, sync_job, **job.args)
        finally:
            lease.end_run()  # on the loop: no statement of this run starts after it
    if inspect.isawaitable(result):  # a sync callable that returned a coroutine
        result = await result
    return result


async def run_handler(app: "App", task: "Task", job: Job, claimed: "ClaimedJob", attempt: int) -> Outcome:
    """Call the handler, bounded by the task's timeout, and decide the outcome. Raises only
    ``asyncio.CancelledError`` (the worker cancelled the run: its lease was lost)."""
    try:
        if task.timeout is None:
            result = await _invoke(task, job)
        else:
            try:
                result = await asyncio.wait_for(_invoke(task, job), task.timeout)
            except asyncio.TimeoutError:
                raise JobTimeout(f"job exceeded its timeout of {task.timeout:g}s") from None
        if isinstance(result, Snooze):
            raise result
        if result is None:
            return Done(None)
        return Done(to_json(result, "result not storable (the handler's return value)", app.max_result_bytes,
                            ResultNotStorable, "App(max_result_bytes=...)"))
    except asyncio.CancelledError:
        raise
    except Snooze as snooze:
        return Snoozed(snooze.seconds)
    except Cancel as cancel:
        return Cancelled(cancel.reason)
    except BaseException as caught:  # noqa: BLE001 - every failure is recorded, even BaseException
        return decide_failure(task, attempt, claimed.max_attempts, format_error(caught), caught)
