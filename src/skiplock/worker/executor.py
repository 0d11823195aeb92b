"""Runs one claimed job inside its lease transaction and writes the outcome.

Guarantees (transaction lease):
- The handler runs on the lease connection, with a SAVEPOINT taken when it first reads ``job.conn``
  (only then: see ``savepoint`` in queries.sql). If it returns, the ``done`` update
  is written in the same transaction and committed: its database writes and the completion commit
  together, or neither does.
- If it raises (or asks to retry, snooze or cancel), we roll back to the savepoint (its effects
  vanish, the row lock stays ours) and write the outcome in the same transaction, so nobody can
  claim the job between the rollback and the record of why it did not finish.
- If the connection itself is gone (killed backend, timeout, network), the server has rolled the
  whole attempt back; the outcome is then written in a fresh transaction that never waits on a row
  lock (see ``record_outcome`` in queries.sql). If the row is still locked (the dead session has not
  exited yet, or another worker claimed the job again), the error is kept in job_attempts, outside
  every lease, and the job's next finishing write that commits records it.
- Every attempt is counted on a separate autocommit connection before the handler starts, so a
  handler that kills its worker process still uses up an attempt and ends ``failed``. An attempt that
  never finished is charged only if it ran alone in its process (see ``gate.py``): when a process
  with several slots dies, the jobs in flight in it are not charged; each runs its next attempt
  alone in its process, where a crash is its own.
- Every outcome is storable or reported truthfully: a result that jsonb cannot hold (NUL, a lone
  surrogate, NaN, not JSON, too large) fails the attempt with an error saying so (``ResultNotStorable``),
  before any write; error texts are made storable (``storable_text``) before they are written; a
  delay is checked where it is given (``Retry``, ``Snooze``, policies: see retry.py) and a policy
  that returns a bad one fails the job saying so. None of these costs a reconnect or a batch.
- A snooze gives its attempt back in both lease modes.
- A task ``timeout`` is enforced twice: PostgreSQL ends the job's transaction (statement, idle and
  transaction timeouts set locally), and the worker stops waiting for a handler stuck in Python
  (the handler runs in its own thread), ends the session and frees the slot.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import psycopg

from ..values import to_json
from ..backend.base import ClaimedJob
from ..backend.postgres.backend import CONNECTION_LOST, session_gone
from ..job import Cancel, Cancelled, Done, Failed, Job, JobState, LeaseLost, Outcome, Snooze, Snoozed
from .batching import BatchPolicy
from .completer import Completer
from .failures import (MAX_ERROR_CHARS, ResultNotStorable, decide_failure, describe,  # noqa: F401 - public here too
                       format_error)
from .gate import RunGate

if TYPE_CHECKING:
    from ..app import App, Task
    from .heartbeat import Heartbeat

log = logging.getLogger("skiplock.worker")

T = TypeVar("T")


class JobTimeout(Exception):
    """The handler ran past its task's ``timeout``."""


@dataclass
class BatchRun:
    """What one claim's transaction did: the durable outcomes, and whether it stopped starting jobs
    because its time budget ran out (or the worker is stopping) before all of them had run."""

    outcomes: list[Outcome]
    out_of_time: bool = False
    seconds_per_job: float | None = None  # a batch's mean time per job, its claim and COMMIT left out
    alone: bool = False  # the claim's first job had to run alone (see Executor.alone)
    handler_seconds: float = 0.0  # time spent in handlers (the rest of the lease is skiplock's overhead)


class Executor:
    """Executes claimed jobs for one worker; shared by its slots (it holds no per-job state)."""

    def __init__(self, app: "App", worker_name: str, heartbeat: "Heartbeat | None" = None,
                 batching: "BatchPolicy | None" = None, slots: int = 1):
        self.app = app
        # With one slot every attempt runs alone in its process: one that never finishes is charged.
        self.alone_in_process = slots == 1
        self.gate = RunGate()
        self.batching = batching if batching is not None else BatchPolicy()
        self.heartbeat = heartbeat
        self.backend = app.backend
        self.completer = Completer(self.backend)
        self.worker_name = worker_name
        self._attempts_conns: list[psycopg.Connection[Any]] = []
        self._attempts_lock = threading.Lock()
        self._local = threading.local()

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _bookkeeping(self, op: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``op`` on this slot's own autocommit bookkeeping connection (no lock shared between
        slots), reconnecting once if it was lost."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "attempts_conn", None)
        for retry in (False, True):
            if conn is None or conn.closed:
                conn = self.backend.connect_bookkeeping()
                with self._attempts_lock:
                    self._attempts_conns.append(conn)
                self._local.attempts_conn = conn
            try:
                return op(conn)
            except CONNECTION_LOST as exc:
                if not session_gone(exc):
                    raise  # an error of a live session (a deadlock, say): the connection is fine
                conn.close()
                conn = None
                if retry:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._attempts_lock:
            for conn in self._attempts_conns:
                conn.close()
            self._attempts_conns.clear()

    # ---- running -------------------------------------------------------------------------------

    def alone(self, name: str) -> bool:
        """Jobs that never share a transaction with other jobs: the batching policy's decision
        (``BatchPolicy.alone``)."""
        return self.batching.alone(self.app.tasks.get(name))

    def run_batch(self, conn: psycopg.Connection[Any], batch: list[ClaimedJob], slot: str, budget: float,
                  stopping: threading.Event) -> BatchRun:
        """Run the jobs one claim locked, in that claim's transaction, and COMMIT. Returns the
        outcomes that are durable. A job that
        must run alone (see ``alone``) runs alone: first, or not in this transaction (the jobs not
        started are released untouched by the COMMIT). Its handlers hold the process's run gate
        shared (a suspect's run takes it exclusive, see ``run``)."""
        self._local.handler_seconds = 0.0
        with self.gate.shared():
            run = self._run_batch(conn, batch, slot, budget, stopping)
        run.handler_seconds = self._local.handler_seconds
        return run

    def _run_batch(self, conn: psycopg.Connection[Any], batch: list[ClaimedJob], slot: str, budget: float,
                   stopping: threading.Event) -> BatchRun:
        alone = self.alone(batch[0].task)
        if alone:
            task = self.app.tasks[batch[0].task]
            if task.lease == "claimed":
                return BatchRun([self.run_claimed(conn, batch[0], task, slot)], alone=True)
            batch = batch[:1]
        else:
            for n in range(1, len(batch)):
                if self.alone(batch[n].task):
                    batch = batch[:n]
                    break
        if len(batch) > 1:
            return self._run_many(conn, batch, slot, budget, stopping)
        outcome = self.run(conn, batch[0], slot, commit=True)
        if not conn.closed:
            conn.commit()  # the paths that wrote without running a handler (nothing to do if committed)
        return BatchRun([outcome], alone=alone)

    def _run_many(self, conn: psycopg.Connection[Any], batch: list[ClaimedJob], slot: str, budget: float,
                  stopping: threading.Event) -> BatchRun:
        """Several jobs in one transaction, one after another, then one COMMIT.

        One durable write marks the batch before the first handler starts (``start_batch``: if the
        transaction never commits, each of its jobs later runs alone with a counted attempt). Each job
        gets its own savepoint as soon as its handler reads ``job.conn``: a failure rolls back only its
        own work. A job whose handler touched the database is completed at once, inside its savepoint
        (a refused completion rolls back its work alone); the others are written ``done`` together at
        the end, in one statement sent with the COMMIT (one round trip; one refused there because a
        cancellation was requested meanwhile had no effects, and is recorded cancelled afterwards).
        Stops starting jobs once ``budget`` seconds have passed or the worker is stopping. A suspect
        runs alone: first, or not in this batch. A job asked to cancel or of an unknown task takes the
        single-job path (``run``). If the lease ends mid-batch, every job's work in it was rolled back:
        none of them is reported, and each runs again, alone."""
        backend = self.backend
        started_at = batch[0].claimed_at
        batch_id, suspects, cancels = self._bookkeeping(
            lambda c: backend.start_batch(c, batch, slot, conn.info.backend_pid))
        if suspects:  # one may crash its worker: it runs alone, the jobs after it are released at COMMIT
            first = next(i for i, claimed in enumerate(batch) if claimed.id in suspects)
            batch = batch[:max(first, 1)]
        outcomes: list[Outcome] = []
        done: list[tuple[ClaimedJob, int, str | None]] = []
        deadline = time.monotonic() + budget
        def take_savepoint() -> None:
            backend.savepoint(conn)

        out_of_time = False
        began = time.perf_counter()
        for i, claimed in enumerate(batch):
            if i and (time.monotonic() > deadline or stopping.is_set()):
                out_of_time = True
                break
            task = self.app.tasks.get(claimed.task)
            attempt = claimed.attempts + 1
            if (task is None or claimed.id in suspects or claimed.id in cancels
                    or attempt > claimed.max_attempts):
                outcome = self.run(conn, claimed, slot, batch=batch_id if claimed.id in suspects else None)
            else:
                job = Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
                          priority=claimed.priority, state=JobState.RUNNING, attempts=attempt,
                          max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
                          started_at=started_at, worker=slot, _conn=conn, _before_conn=take_savepoint)
                outcome = self._handle(task, job, claimed, attempt, conn)
                touched = job._before_conn is None
                if isinstance(outcome, Done) and not touched:
                    done.append((claimed, attempt, outcome.result))
                    continue
                if touched:
                    outcome = self.completer.still_leased(conn, task, attempt, claimed, outcome)
                outcome = self.completer.write(conn, claimed, attempt, outcome, started_at, slot, touched)
                if touched:
                    self.completer.release(conn)
            if conn.closed:  # the lease was ended on purpose; only this job's outcome was recorded
                return BatchRun([outcome])
            outcomes.append(outcome)
        ran = len(outcomes) + len(done)
        seconds_per_job = (time.perf_counter() - began) / ran if ran else None
        written = backend.complete_batch(conn, batch_id, done, started_at, slot)  # and COMMIT
        for claimed, attempt, result in done:
            if claimed.id in written:
                outcomes.append(Done(result))
            else:  # a cancellation was requested while it ran (it had no database effects): record it
                outcomes.append(self.completer.write(conn, claimed, attempt, Cancelled("cancellation requested while the job ran"),
                                            started_at, slot, False))
        return BatchRun(outcomes, out_of_time, seconds_per_job)

    def run(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, slot: str,
            batch: int | None = None, commit: bool = False) -> Outcome:
        """Run one job and write its outcome in the lease transaction, its attempt counted first on
        the bookkeeping connection; with ``commit``, a handler's run is committed here (see ``_commit``).
        Its savepoint is taken when the handler first reads ``job.conn`` (see ``savepoint`` in
        queries.sql for why never before). ``batch``: the job is a suspect running alone in that batch's transaction."""
        started_at = claimed.claimed_at  # the database's clock, like finished_at
        backend = self.backend

        attempt, cancel_reason, unrecorded, suspect = self._bookkeeping(
            lambda c: backend.start_attempt(c, claimed, slot, conn.info.backend_pid, self.alone_in_process, batch))
        if cancel_reason is not None:
            return self.completer.write(conn, claimed, attempt - 1, Cancelled(cancel_reason), started_at, slot, False)
        if attempt > claimed.max_attempts:
            if unrecorded is not None:
                # The last attempt did finish, with this error, but its outcome could not be written (its
                # row was still locked): it is failed for that reason (recorded once: it is pending).
                return self.completer.write(conn, claimed, attempt - 1, Failed(unrecorded), started_at, slot, False)
            error = (
                f"gave up: {attempt - 1} attempt(s) started and none finished; the worker process died or lost its "
                "database connection during each (does the handler crash its worker?)"
            )
            return self.completer.write(conn, claimed, attempt - 1, Failed(error), started_at, slot, False)
        task = self.app.tasks.get(claimed.task)
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            error = (f"unknown task {claimed.task!r}: no handler is registered under that name in this worker "
                     f"(registered: {known}). The job is kept as failed.")
            return self.completer.write(conn, claimed, attempt, Failed(error), started_at, slot, False)

        if suspect and not self.alone_in_process:
            # Its last attempt (or its batch) never finished: this one runs alone in the process, and is
            # charged if it never finishes either (see gate.py).
            log.info("job %s: its previous run never finished; attempt %s runs alone in this process",
                     claimed.id, attempt)
            with self.gate.exclusive():
                self._bookkeeping(lambda c: backend.mark_exclusive(c, claimed.id, attempt))
                return self._run_counted(conn, claimed, task, attempt, slot, commit)
        return self._run_counted(conn, claimed, task, attempt, slot, commit)

    def _run_counted(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, task: "Task", attempt: int, slot: str,
                     commit: bool) -> Outcome:
        """The handler of a counted attempt, and its outcome written in the lease transaction."""
        backend = self.backend
        started_at = claimed.claimed_at
        if task.timeout is not None:
            backend.set_local_timeouts(conn, task.timeout)
        job = Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
                  priority=claimed.priority, state=JobState.RUNNING, attempts=attempt,
                  max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
                  started_at=started_at, worker=slot, _conn=conn, _before_conn=lambda: backend.savepoint(conn))
        outcome = self._handle(task, job, claimed, attempt, conn)
        touched = job._before_conn is None
        if touched:
            outcome = self.completer.still_leased(conn, task, attempt, claimed, outcome)
        outcome = self.completer.write(conn, claimed, attempt, outcome, started_at, slot, touched)
        if touched and not commit:
            self.completer.release(conn)
        if commit and not conn.closed:
            return self.completer.commit(conn, claimed, task, attempt, outcome, started_at, slot)
        return outcome

    def run_claimed(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, task: "Task", slot: str) -> Outcome:
        """Claimed lease: mark the job running with our owner token and a lease, COMMIT (the attempt
        is now durable and the row lock released), run the handler while the heartbeat renews the
        lease, then finish with a write fenced on state and owner. The handler's writes through
        ``job.conn`` commit with that fenced write, so they vanish too if the lease was lost. A job
        claimed with no attempt left (nothing re-queues one, but a row may say so) is failed, not run."""
        backend = self.backend
        started_at = claimed.claimed_at
        if claimed.attempts >= claimed.max_attempts:
            error = (f"gave up: {claimed.attempts} attempt(s) used of max_attempts {claimed.max_attempts}; "
                     "the job is not run again")
            outcome = self.completer.write(conn, claimed, claimed.attempts, Failed(error), started_at, slot, False)
            if not conn.closed:
                conn.commit()
            return outcome
        owner = uuid.uuid4()
        started = backend.start_claimed(conn, claimed, owner, task.lease_seconds, slot)
        conn.commit()
        if started is None:  # not queued any more (cannot happen while we held its lock)
            return LeaseLost(Failed("not queued when claimed"))
        attempt, cancel_reason = started
        if cancel_reason is not None:
            return self.completer.finish_claimed(conn, claimed, attempt - 1, Cancelled(cancel_reason), started_at, slot, owner,
                                        task)
        if self.heartbeat is not None:
            self.heartbeat.hold(claimed.id, owner, task.lease_seconds)
        job = Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
                  priority=claimed.priority, state=JobState.RUNNING, attempts=attempt,
                  max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
                  started_at=started_at, worker=slot, _conn=conn)
        try:
            outcome = self._handle(task, job, claimed, attempt, conn)
        finally:
            if self.heartbeat is not None:
                self.heartbeat.release(claimed.id)
        return self.completer.finish_claimed(conn, claimed, attempt, outcome, started_at, slot, owner, task)

    def _handle(self, task: "Task", job: Job, claimed: ClaimedJob, attempt: int,
                conn: psycopg.Connection[Any]) -> Outcome:
        """Call the handler and turn what happened into an outcome (nothing is written here)."""
        began = time.perf_counter()
        try:
            result = self._call(task, job, claimed.args)
            if isinstance(result, Snooze):
                raise result
            return Done(self._result_json(result))
        except Snooze as snooze:
            return Snoozed(snooze.seconds)
        except Cancel as cancel:
            return Cancelled(cancel.reason)
        except BaseException as caught:  # noqa: BLE001 - every failure is recorded, even BaseException
            # (SystemExit or KeyboardInterrupt raised by a handler is recorded and not re-raised: one
            # bad handler must not take the slot down).
            if isinstance(caught, JobTimeout):
                self._abandon(conn)
            log.warning("job %s (%s) attempt %s/%s failed: %s", claimed.id, claimed.task, attempt,
                        claimed.max_attempts, describe(caught))
            return decide_failure(task, attempt, claimed.max_attempts, format_error(caught), caught)
        finally:
            took = time.perf_counter() - began
            self._local.handler_seconds = getattr(self._local, "handler_seconds", 0.0) + took
            self.batching.measured(task.name, took)

    def _call(self, task: "Task", job: Job, args: dict[str, Any]) -> Any:
        """The handler, in this thread, or in its own thread when the task has a timeout (so a
        handler stuck in a blocking call cannot hold the slot). ``async def`` handlers run on an
        event loop of the calling thread."""
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

        threading.Thread(target=target, name=f"skiplock-job-{job.id}", daemon=True).start()
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

    def _abandon(self, conn: psycopg.Connection[Any]) -> None:
        """Give up on a handler still running: end its session (the server rolls the attempt back)
        and close the connection; the slot reconnects and moves on."""
        try:
            self.backend.terminate([conn.info.backend_pid])
        except psycopg.Error as exc:
            log.warning("could not end the session of a timed-out job: %s", exc)
        conn.close()

    def _result_json(self, result: Any) -> str | None:
        """The result as jsonb text, or ResultNotStorable saying why not (the checks of job args)."""
        if result is None:
            return None
        return to_json(result, "result not storable (the handler's return value)", self.app.max_result_bytes,
                       ResultNotStorable, "App(max_result_bytes=...)")
