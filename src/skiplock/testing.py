"""Helpers for testing code that uses skiplock, against a real database (docs/testing.md).

- :func:`rolled_back`: a connection whose transaction is rolled back at the end, whatever happens
  (``commit()`` inside it is refused): enqueue on it, run tasks inline on it, assert what it holds;
  nothing is left behind, and no worker ever sees its jobs (nor is woken for them).
- :func:`run_inline`: run a task's handler now, in this thread, inside that transaction: ``job.conn``
  is the test's connection, so the handler's writes can be checked before they vanish.
- :func:`assert_enqueued`: the jobs matching a task / args / queue, or an AssertionError listing
  what is enqueued instead.
- :func:`drain`: run every available (committed, due) job of the app's tasks to completion with a
  real worker in this process, and return its counts.

    import skiplock.testing as sl

    with sl.rolled_back(app) as conn:
        sl.run_inline(app, "signup", {"email": "a@example.com"}, conn=conn)
        sl.assert_enqueued(app, task="send_welcome_email", args={"to": "a@example.com"}, conn=conn)
"""

from __future__ import annotations

import asyncio
import inspect
import json
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Sequence

from .app import App, serialise_args, to_json
from .errors import InvalidJob
from .job import Job, JobState, Snooze
from .worker import WorkerStats
from .worker.executor import ResultNotStorable  # what a worker fails a job with an unstorable result for

INLINE_WORKER = "skiplock.testing"  # the ``worker`` of a job run by run_inline
SHOWN = 20  # jobs listed by a failed assert_enqueued


@contextmanager
def rolled_back(app: App) -> Iterator[Any]:
    """A new connection to ``app``'s database (READ COMMITTED, like skiplock's own sessions) with a
    transaction open for the whole block and rolled back when it ends -- also on error. Inside it,
    ``conn.commit()`` raises ``psycopg.ProgrammingError`` (nothing can escape the rollback), and
    ``conn.transaction()`` blocks are savepoints. Jobs enqueued on it are never seen by workers:
    they exist only in this transaction. Checks the app's schema first (a clear error if missing)."""
    app.check()
    with app.backend.testing().rolled_back("skiplock-testing") as conn:
        yield conn


def run_inline(app: App, task: str, args: Mapping[str, Any] | None = None, *,
               conn: Any = None, **options: Any) -> Any:
    """Run ``task``'s handler now, in this thread, as a worker would run the job's first attempt in
    a transaction lease, but inside ``conn``'s transaction (a :func:`rolled_back` one; without
    ``conn``, a rolled-back transaction of its own). Returns the handler's result.

    - The job is enqueued on ``conn`` first, with :meth:`App.enqueue`'s checks (``options`` are its
      options: queue, priority, max_attempts, ...; not ``unique_key``: this runs a new job, now,
      whatever ``run_at``), so a bad input raises what enqueue raises (:class:`InvalidJob`, ...);
      an unregistered task raises :class:`UnknownTask`.
    - The handler gets a :class:`Job` (id, args as stored -- JSON types, attempt 1) whose
      ``job.conn`` is ``conn``; ``async def`` handlers run on a new event loop (call run_inline from
      synchronous test code).
    - It runs in a savepoint: if it raises (``Retry``, ``Snooze`` and ``Cancel`` included, and a
      returned ``Snooze``) its writes are undone and the exception reaches you; the job stays queued
      in the transaction. A result that could not be stored (not JSON, over ``max_result_bytes``)
      raises the worker's ``ResultNotStorable``. Otherwise the job is written ``done`` with its
      result, in the transaction.
    - Not applied: the task's ``timeout``, its retry policy, the lease mode (a claimed-lease task
      runs inside the transaction too) -- run the job with :func:`drain` to have them.
    """
    registered = app.get_task(task)
    if conn is None:
        with rolled_back(app) as own:
            return run_inline(app, task, args, conn=own, **options)
    app.backend.testing().check_connection(conn)
    keyed = sorted({"unique_key", "on_conflict"} & set(options))
    if keyed:  # enqueue may return another job's id: that job is not this run's
        raise InvalidJob(f"run_inline runs a new job: {', '.join(keyed)} not accepted "
                         "(enqueue with app.enqueue(..., unique_key=...) and run it with drain)")
    job_id = app.enqueue(task, args, conn=conn, **options)
    db = app.backend.testing()
    row = db.job_row(conn, job_id)
    if row is None:
        raise RuntimeError(f"job {job_id}, just enqueued in this transaction, is not there")
    started_at = datetime.now(timezone.utc)
    job = _job(row, attempts=1, started_at=started_at, worker=INLINE_WORKER, _conn=conn)
    with db.savepoint(conn):  # a savepoint: a handler that raises leaves none of its writes
        result = registered.fn(job, **job.args)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        if isinstance(result, Snooze):
            raise result
        result_json = None if result is None else to_json(
            result, "result not storable (the handler's return value)", app.max_result_bytes, ResultNotStorable,
            "App(max_result_bytes=...)")
        db.finish_inline(conn, job_id, started_at, result_json, INLINE_WORKER)
    return result


def assert_enqueued(app: App, *, task: str | None = None, args: Mapping[str, Any] | None = None,
                    queue: str | None = None, state: str | None = "queued", count: int | None = None,
                    conn: Any = None) -> list[Job]:
    """The jobs (in id order) in ``state`` (default ``queued``; None: any) that match every filter
    given: ``task``, ``queue``, and ``args`` (equal to the stored args, compared as JSON: a tuple
    matches a list). At least one must match -- exactly ``count`` if given -- else AssertionError
    saying what was expected and listing the jobs that are in that state.

    With ``conn``, the jobs that connection's transaction sees, its own uncommitted ones included;
    without, the committed ones (:meth:`App.list_jobs`)."""
    if state is not None:
        try:
            state = JobState(state).value
        except ValueError:
            raise InvalidJob(f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}") from None
    wanted_args = None if args is None else json.loads(serialise_args(args, app.max_args_bytes))
    if conn is None:
        jobs = app.list_jobs(state=state, limit=100_000)[::-1]  # newest first there
    else:
        db = app.backend.testing()
        db.check_connection(conn, reading=True)
        jobs = [_job(r) for r in db.jobs_in_transaction(conn, state)]
    matching = [j for j in jobs if (task is None or j.task == task) and (queue is None or j.queue == queue)
                and (wanted_args is None or j.args == wanted_args)]
    if matching if count is None else len(matching) == count:
        return matching
    raise AssertionError(_mismatch(task, wanted_args, queue, state, count, matching, jobs))


def drain(app: App, queues: Sequence[str] | None = None, *, concurrency: int = 1, **worker_options: Any) -> WorkerStats:
    """Run every available job -- committed, due, of a task registered in ``app``, in ``queues``
    (all if None) -- to completion in this process, with a real worker (``app.worker(...)``,
    ``run(stop_when_empty=True)``): the same leases, retries, timeouts and outcomes as in
    production. Jobs the handlers enqueue are run too, when due. Returns the worker's counts
    (``done``, ``retried``, ``failed``, ``snoozed``, ``cancelled``). A job retried or snoozed with a
    delay is not due yet, so drain returns before it (it stays queued).

    ``concurrency`` defaults to 1 (jobs run one after another, in claim order); ``worker_options``
    are :class:`Worker`'s. No maintenance services (scheduler, pruner, rescuer) and no LISTEN
    connection, unless asked for. Jobs enqueued in a :func:`rolled_back` transaction are invisible
    here (they were never committed)."""
    worker_options.setdefault("maintenance", False)
    worker_options.setdefault("listen", False)
    worker_options.setdefault("handle_signals", False)
    return app.worker(queues=queues, concurrency=concurrency, **worker_options).run(stop_when_empty=True)


# ---- plumbing -------------------------------------------------------------------------------------


def _job(row: Mapping[str, Any], **fields: Any) -> Job:
    data = {**row, **fields}
    data["state"] = JobState(data["state"])
    return Job(**data)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _mismatch(task: str | None, args: Any, queue: str | None, state: str | None, count: int | None,
              matching: list[Job], jobs: list[Job]) -> str:
    wanted = ", ".join(f"{name}={value!r}" for name, value in (("task", task), ("args", args), ("queue", queue))
                       if value is not None) or "any task"
    kind = f"{state} " if state else ""
    found = f"{len(matching)} match" if matching else "none matches"
    head = (f"expected {count} {kind}job(s) with {wanted}; {found}" if count is not None
            else f"expected a {kind}job with {wanted}; none matches")
    if not jobs:
        return f"{head}; no job is {state or 'stored'}"
    lines = [f"  #{j.id} {j.task} queue={j.queue!r} args={j.args!r}" + ("" if state else f" state={j.state}")
             for j in jobs[:SHOWN]]
    more = [f"  ... and {len(jobs) - SHOWN} more"] if len(jobs) > SHOWN else []
    return "\n".join([f"{head}; {kind or ''}jobs ({len(jobs)}):", *lines, *more])
