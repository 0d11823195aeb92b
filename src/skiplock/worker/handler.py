"""Calling a handler and turning what happened into an outcome value (nothing is written here).

- ``handler(job, **job.args)``, in the slot's thread, or in its own thread when the task has a
  ``timeout``: a handler stuck in a blocking call cannot hold the slot; past its timeout the worker
  stops waiting (``JobTimeout``), ends the lease (``Lease.end``: the server rolls the attempt back)
  and the slot moves on. ``async def`` handlers run on an event loop of the calling thread.
- Every exception a handler raises is an outcome (its own statements on ``job.conn`` may raise the
  driver's errors: they are handler exceptions like any other), even a BaseException (SystemExit,
  KeyboardInterrupt: one bad handler must not take the slot down).
- A result jsonb cannot hold fails the attempt with ``ResultNotStorable`` before any write.
- A lease the watchdog ended (a backend without server-side lease bounds) is the attempt's failure
  (``LeaseTimeout``), whatever the handler returned.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DatabaseError, DatabaseUnavailable
from ..job import Cancel, Cancelled, Done, Job, JobState, Outcome, Snooze, Snoozed
from ..values import to_json
from ..observability.reporting import JobReporter, outcome_name
from .failures import ResultNotStorable, decide_failure, describe, format_error  # noqa: F401 - describe: public here

if TYPE_CHECKING:
    from ..app import App, Task
    from ..backend.base import ClaimedJob, Lease
    from .batching import BatchPolicy
    from .watchdog import Watchdog

log = logging.getLogger("skiplock.worker")


class JobTimeout(Exception):
    """The handler ran past its task's ``timeout``."""


class LeaseTimeout(Exception):
    """The job's lease ran past its limit and the worker's watchdog ended it (a backend that does not
    bound leases itself)."""


def make_job(claimed: "ClaimedJob", attempt: int, slot: str, lease: "Lease",
             before_conn: "Callable[[], None] | None" = None) -> Job:
    """The ``Job`` a handler gets: ``job.conn`` is the lease's connection; ``before_conn`` runs when the
    handler first reads it (the job's savepoint)."""
    return Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
               priority=claimed.priority, state=JobState.RUNNING, attempts=attempt,
               max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
               started_at=claimed.claimed_at, worker=slot, _conn=lease.conn, _before_conn=before_conn)


class Handlers:
    """Runs handlers for one worker's slots (per-thread event loops and handler time)."""

    def __init__(self, app: "App", batching: "BatchPolicy", watchdog: "Watchdog | None" = None,
                 reporter: "JobReporter | None" = None):
        self.app = app
        self.batching = batching
        self.watchdog = watchdog
        self.reporter = reporter if reporter is not None else JobReporter(app.hooks, app.metrics)
        self._local = threading.local()

    @property
    def seconds(self) -> float:
        """Seconds this thread spent in handlers since ``reset``."""
        return getattr(self._local, "handler_seconds", 0.0)

    @property
    def ran(self) -> "dict[int, tuple[int, float]]":
        """Job id -> (attempt, handler seconds) of the handlers this thread ran since ``reset``
        (what the reporter says about each finished job)."""
        return self._local.ran

    def reset(self) -> None:
        self._local.handler_seconds = 0.0
        self._local.ran = {}
        self._local.carriers = None  # (each lease's handling begins here: Executor.run_batch)

    def handle(self, task: "Task", job: Job, claimed: "ClaimedJob", attempt: int, lease: "Lease") -> Outcome:
        """Call the handler and turn what happened into an outcome; with tracing on, in its execute
        span, the enqueuer's span its parent (observability/tracing.py)."""
        tracing = self.app.tracing
        if tracing is None:
            return self._handle(task, job, claimed, attempt, lease)
        # The contexts of this lease's jobs, if already taken (a claimed lease's, a side-by-side batch's:
        # a job not in them has none); else a transaction lease's job's own, taken in its transaction.
        carriers = getattr(self._local, "carriers", None)
        if carriers is not None:
            carrier = carriers.pop(claimed.id, None)
        else:
            carrier = tracing.take(lease, [claimed]).get(claimed.id) if lease.in_transaction() else None
        started = tracing.start_execute(claimed, attempt, carrier)
        outcome: Outcome | None = None
        try:
            outcome = self._handle(task, job, claimed, attempt, lease)
            return outcome
        finally:
            tracing.end_execute(started, "error" if outcome is None else outcome_name(outcome),
                                getattr(outcome, "error", None))

    def take_trace_contexts(self, lease: "Lease", jobs: "list[ClaimedJob]") -> None:
        """A claimed lease's jobs: their trace contexts, taken before the claim's COMMIT (tracing on)."""
        tracing = self.app.tracing
        if tracing is not None:
            self._local.carriers = tracing.take(lease, jobs)

    def batch_trace_contexts(self, lease: "Lease", jobs: "list[ClaimedJob]") -> "dict[int, dict[str, str]] | None":
        """The trace contexts of a side-by-side batch's jobs, all taken at once by the thread that
        holds its connection, before any of them starts (worker/side_by_side.py); None with tracing off."""
        tracing = self.app.tracing
        return None if tracing is None else tracing.take(lease, jobs)

    def use_trace_contexts(self, carriers: "dict[int, dict[str, str]] | None") -> None:
        """This thread runs jobs of a batch whose trace contexts are ``carriers`` (shared by every
        thread running the batch; a job not in it has none): its handlers take no context from the
        lease, whose connection is the batch's. None: done with that batch."""
        self._local.carriers = carriers

    def _handle(self, task: "Task", job: Job, claimed: "ClaimedJob", attempt: int, lease: "Lease") -> Outcome:
        reporter = self.reporter
        if reporter.wants_start:
            reporter.started(claimed, attempt)
        began = time.perf_counter()
        try:
            result = self._call(task, job, claimed.args)
            if self.watchdog is not None and self.watchdog.ended(lease):
                raise LeaseTimeout(f"the job's lease ran past its limit of {self.watchdog.limit_of(lease):g}s "
                                   "and was ended by the worker")
            if isinstance(result, Snooze):
                raise result
            return Done(self._result_json(result))
        except Snooze as snooze:
            return Snoozed(snooze.seconds)
        except Cancel as cancel:
            return Cancelled(cancel.reason)
        except BaseException as caught:  # noqa: BLE001 - every failure is recorded, even BaseException
            if isinstance(caught, JobTimeout):
                self._abandon(lease)
            # Logged once durable, by the reporter: WARNING if retried, ERROR if it ends failed.
            return decide_failure(task, attempt, claimed.max_attempts, format_error(caught), caught)
        finally:
            took = time.perf_counter() - began
            local = self._local
            local.handler_seconds = getattr(local, "handler_seconds", 0.0) + took
            ran = getattr(local, "ran", None)
            if ran is None:
                ran = local.ran = {}
            ran[claimed.id] = (attempt, took)
            if reporter.metrics is not None:
                reporter.handler_ended(claimed)
            self.batching.measured(task.name, took)

    def _call(self, task: "Task", job: Job, args: dict[str, Any]) -> Any:
        if task.timeout is None:
            return self._await(task.fn(job, **args), self._thread_loop)
        box: dict[str, Any] = {}
        finished = threading.Event()

        def target() -> None:
            try:
                box["result"] = self._await(task.fn(job, **args), asyncio.new_event_loop)
            except BaseException as exc:  # noqa: BLE001 - handed back to the slot thread
                box["error"] = exc
            finally:
                finished.set()

        # in the slot thread's context (the execute span stays current in the handler's own thread)
        threading.Thread(target=contextvars.copy_context().run, args=(target,), name=f"skiplock-job-{job.id}",
                         daemon=True).start()
        if not finished.wait(task.timeout):
            raise JobTimeout(f"job exceeded its timeout of {task.timeout:g}s")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
        return loop

    @staticmethod
    def _await(result: Any, get_loop: Any) -> Any:
        if not inspect.isawaitable(result):
            return result
        loop = get_loop()
        try:
            return loop.run_until_complete(result)
        finally:
            if get_loop is asyncio.new_event_loop:
                loop.close()

    @staticmethod
    def _abandon(lease: "Lease") -> None:
        """Give up on a handler still running: end its lease (the server rolls the attempt back); the
        slot reconnects and moves on."""
        try:
            lease.end()
        except (DatabaseUnavailable, DatabaseError) as exc:  # the lease is closed anyway
            log.warning("could not end the session of a timed-out job: %s", exc)

    def _result_json(self, result: Any) -> str | None:
        """The result as jsonb text, or ResultNotStorable saying why not (the checks of job args)."""
        if result is None:
            return None
        return to_json(result, "result not storable (the handler's return value)", self.app.max_result_bytes,
                       ResultNotStorable, "App(max_result_bytes=...)")
