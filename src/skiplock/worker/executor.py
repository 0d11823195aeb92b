"""Runs the jobs one claim locked inside their lease transaction; the completer writes their outcomes.

The executor decides what runs (attempts counted first, suspects alone, a batch's budget) and calls
the handlers (handler.py), which return outcome values; every write is the completer's
(completer.py, one backend verb). It sees the lease only through ``backend.base.Lease``.

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
- A task ``timeout`` is enforced twice: the server ends the job's transaction (PostgreSQL: statement,
  idle and transaction timeouts set locally), and the worker stops waiting for a handler stuck in
  Python (the handler runs in its own thread), ends the lease and frees the slot. On a backend that
  does not bound leases itself (``Lease.bounded_by_server`` false), the worker's watchdog ends a
  lease held past ``lease_timeout`` or the task's ``timeout`` (watchdog.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Callable, cast

from ..backend.base import ClaimedJob
from ..job import Cancelled, Done, Failed, Outcome
from .batching import BatchPolicy, BatchRun  # noqa: F401 - BatchRun: public here too
from .bookkeeping import Bookkeeping
from .claimed import run_claimed
from .completer import CancelledWhileRunning, Completer
from .failures import (MAX_ERROR_CHARS, ResultNotStorable, decide_failure, format_error)  # noqa: F401 - public here too
from .gate import RunAlone, RunGate  # noqa: F401 - RunAlone: public here too
from .handler import Handlers, JobTimeout, LeaseTimeout, make_job  # noqa: F401 - public here too
from .side_by_side import Hand, Ran, SideBySide, no_work

if TYPE_CHECKING:
    from ..app import App, Task
    from ..backend.base import Backend, Lease
    from .heartbeat import Heartbeat
    from .watchdog import Watchdog

log = logging.getLogger("skiplock.worker")


@dataclass
class Later:
    """A batch run one after another because no slot was idle when it began (``Executor._run_jobs``):
    its tasks (``tasks[i]`` is the batch's i-th job's), the worker's ``hand`` for it, and its trace
    contexts (tracing on)."""

    tasks: "list[Task]"
    hand: Hand
    carriers: "dict[int, dict[str, str]] | None"


class Executor:
    """Executes claimed jobs for one worker; shared by its slots (it holds no per-job state)."""

    def __init__(self, app: "App", worker_name: str, heartbeat: "Heartbeat | None" = None,
                 batching: "BatchPolicy | None" = None, slots: int = 1, watchdog: "Watchdog | None" = None):
        self.app = app
        # With one slot every attempt runs alone in its process: one that never finishes is charged.
        self.alone_in_process = slots == 1
        self.gate = RunGate()
        self.batching = batching if batching is not None else BatchPolicy()
        self.heartbeat = heartbeat
        self.watchdog = watchdog
        self.backend: "Backend" = app.backend
        self.completer = Completer(self.backend)
        self.bookkeeping = Bookkeeping(self.backend)
        self.handlers = Handlers(app, self.batching, watchdog)
        self.worker_name = worker_name
        self.side = SideBySide()

    def close(self) -> None:
        self.bookkeeping.close()

    # ---- running -------------------------------------------------------------------------------

    def alone(self, name: str) -> bool:
        """Jobs that never share a transaction with other jobs: the batching policy's decision
        (``BatchPolicy.alone``)."""
        return self.batching.alone(self.app.tasks.get(name))

    def run_batch(self, lease: "Lease", batch: list[ClaimedJob], slot: str, budget: float,
                  stopping: threading.Event, before_commit: Callable[[], None] | None = None,
                  hand: Hand | None = None) -> BatchRun:
        """Run the jobs one claim locked, in that claim's transaction, and COMMIT. Returns the
        outcomes that are durable. A job that must run alone (see ``alone``) runs alone: first, or
        not in this transaction (the jobs not started are released untouched by the COMMIT). The
        caller holds the process's run gate (gate.py); a suspect that cannot run alone at once
        raises ``RunAlone`` with the lease's transaction let go. ``before_commit``: called once a
        batch of several jobs has run its last handler, before its COMMIT is sent (the worker gives
        its batch turn back there, so the next batch's claim overlaps this one's commit). ``hand``: the
        batch may run side by side, its jobs handed to idle slots by this (side_by_side.py)."""
        handlers = self.handlers
        handlers.reset()
        try:
            run = self._run_batch(lease, batch, slot, budget, stopping, before_commit, hand)
        except CancelledWhileRunning as ended:  # recorded cancelled (durable); the slot reconnects
            handlers.reporter.finished([ended.claimed], [ended.outcome], handlers.ran)
            raise
        if not run.side_by_side:
            run.handler_seconds = handlers.seconds
        if run.jobs is not None:  # durable now: logs, hooks, metrics (observability/reporting.py)
            handlers.reporter.finished(run.jobs, run.outcomes, handlers.ran)
        return run

    def _run_batch(self, lease: "Lease", batch: list[ClaimedJob], slot: str, budget: float,
                   stopping: threading.Event, before_commit: Callable[[], None] | None, hand: Hand | None) -> BatchRun:
        alone = self.alone(batch[0].task)
        if hand is not None and (alone or len(batch) == 1 or self.alone(batch[1].task)):
            hand(0, no_work)  # not a batch: nothing to hand out (the wake-ups it owes go out now)
            hand = None
        if alone:
            task = self.app.tasks[batch[0].task]
            if task.lease == "claimed":
                self.handlers.take_trace_contexts(lease, batch[:1])  # tracing on: before the claim's COMMIT
                return BatchRun([self.run_claimed(lease, batch[0], task, slot)], alone=True, jobs=batch[:1])
            batch = batch[:1]
        else:
            for n in range(1, len(batch)):
                if self.alone(batch[n].task):
                    batch = batch[:n]
                    break
        watchdog = self.watchdog
        if watchdog is not None:  # the server does not bound this lease: the worker does
            watchdog.watch(lease, self.app.lease_timeout)
        try:
            if len(batch) > 1:
                return self._run_many(lease, batch, slot, budget, stopping, before_commit, hand)
            outcome = self.run(lease, batch[0], slot, commit=True)
            if lease.alive():
                lease.commit()  # the paths that wrote without running a handler (nothing to do if committed)
            return BatchRun([outcome], alone=alone, jobs=batch)
        finally:
            if watchdog is not None:
                watchdog.release(lease)

    def _run_many(self, lease: "Lease", batch: list[ClaimedJob], slot: str, budget: float,
                  stopping: threading.Event, before_commit: Callable[[], None] | None = None,
                  hand: Hand | None = None) -> BatchRun:
        """Several jobs in one transaction, one after another -- or, handed to idle slots by ``hand``,
        side by side (side_by_side.py; never a flow-controlled batch: it holds one slot of
        each key for all its jobs, see ``claim_flow`` in queries.sql) --, then one COMMIT.

        One durable write marks the batch before the first handler starts (``start_batch``: if the
        transaction never commits, each of its jobs later runs alone with a counted attempt). Each job
        gets its own savepoint as soon as its handler reads ``job.conn``: a failure rolls back only its
        own work. A job whose handler touched the database is completed at once, its savepoint
        released first (a completion a cancellation refuses then rolls back the whole batch, as
        ``cancel_job`` ending the session does); the others are written ``done`` together at the
        end, with the COMMIT (``Completer.finish_batch``). Stops starting jobs once ``budget``
        seconds have passed or the worker is stopping. A suspect runs alone: first, or not in this
        batch. A job asked to cancel or of an unknown task takes the single-job path (``run``). If the
        lease ends mid-batch, every job's work in it was rolled back: none of them is reported, and
        each runs again, alone."""
        backend, completer = self.backend, self.completer
        started_at = batch[0].claimed_at
        batch_id, suspects, cancels = self.bookkeeping.run(
            lambda c: backend.start_batch(c, batch, slot, lease.session_id), again=False)
        if suspects and hand is not None:
            hand(0, no_work)  # not side by side (the wake-ups it owes go out now)
            hand = None
        if suspects:  # one may crash its worker: it runs alone, the jobs after it are released at COMMIT
            first = next(i for i, claimed in enumerate(batch) if claimed.id in suspects)
            batch = batch[:max(first, 1)]
            if first == 0:
                with self.gate.alone() as alone:
                    if not alone:  # never wait at the gate holding a transaction (gate.py): let it go
                        completer.finish_batch(lease, batch_id, [], started_at, slot)  # its row goes, nothing ran
                        raise RunAlone(batch[0].id)
                    return self._run_jobs(lease, batch, slot, budget, stopping, batch_id, suspects, cancels,
                                          before_commit)
        tasks = self._side_by_side(batch, suspects, cancels, hand)
        if tasks is not None and hand is not None:
            return self._run_side_by_side(lease, batch, tasks, slot, budget, stopping, batch_id, hand,
                                          before_commit)
        if hand is not None:
            hand(0, no_work)  # (handing nothing: the wake-ups it owes go out now)
        return self._run_jobs(lease, batch, slot, budget, stopping, batch_id, suspects, cancels, before_commit)

    def _side_by_side(self, batch: list[ClaimedJob], suspects: "set[int]", cancels: "dict[int, str]",
                      hand: Hand | None) -> "list[Task] | None":
        """The batch's tasks if it runs side by side: it may (``hand``), and it holds no job that takes
        the single-job path or must not run at once with its batch-mates (side_by_side.py)."""
        if hand is None or batch[0].slots:
            return None
        tasks: list[Task] = []
        for claimed in batch:
            task = self.app.tasks.get(claimed.task)
            if task is None or self._single_path(claimed, suspects, cancels):
                return None
            tasks.append(task)
        return tasks

    @staticmethod
    def _single_path(claimed: ClaimedJob, suspects: "set[int]", cancels: "dict[int, str]") -> bool:
        """A job of a batch that takes the single-job path (``run``), a known task's or not: a suspect,
        one asked to cancel, or one whose attempts are used up."""
        return claimed.id in suspects or claimed.id in cancels or claimed.attempts + 1 > claimed.max_attempts

    def _run_side_by_side(self, lease: "Lease", batch: list[ClaimedJob], tasks: "list[Task]", slot: str,
                          budget: float, stopping: threading.Event, batch_id: int, hand: Hand,
                          before_commit: Callable[[], None] | None) -> BatchRun:
        """The jobs of batch ``batch_id`` side by side (side_by_side.py), then its COMMIT: each
        outcome as ``_run_jobs`` writes it; a lease ended meanwhile reports only the outcomes
        written from a fresh transaction after it was gone (the rest run again). With no slot idle
        when it starts, ``_run_jobs`` runs it one after another until a slot goes idle, and the jobs
        left then side by side (``Later``). With tracing on, the batch's trace contexts are read
        here, once, before any of its jobs starts."""
        handlers = self.handlers
        carriers = handlers.batch_trace_contexts(lease, batch)
        handlers.use_trace_contexts(carriers)
        try:
            side = self.side.run(self, lease, batch, tasks, slot, time.monotonic() + budget, stopping, hand, carriers)
            if side is None:  # no slot idle: one after another, until one goes idle
                return self._run_jobs(lease, batch, slot, budget, stopping, batch_id, set(), {}, before_commit,
                                      later=Later(tasks, hand, carriers))
        finally:
            handlers.use_trace_contexts(None)
        rans, longest = side
        return self._side_by_side_ran(lease, batch_id, rans, longest, [], [], [], slot, before_commit)

    def _side_by_side_ran(self, lease: "Lease", batch_id: int, rans: "list[Ran]", longest: float,
                          outcomes: list[Outcome], reported: list[ClaimedJob],
                          done: list[tuple[ClaimedJob, int, str | None]], slot: str,
                          before_commit: Callable[[], None] | None, before: tuple[float, float] = (0.0, 0.0)) -> BatchRun:
        """The end of batch ``batch_id`` once its jobs ``rans`` ran side by side (``longest``: the
        most handler time a slot they were handed to spent), then its COMMIT. ``outcomes``,
        ``reported``, ``done`` and ``before`` (wall seconds, this thread's handler seconds): those of
        the batch's jobs that ran one after another before them (``_run_jobs`` with ``Later``), in
        the same transaction."""
        wall, own = before
        # the batch's handler time as its lease saw it: the part one after another, then the busiest
        # thread's (they ran at once)
        handler_seconds = own + max(self.handlers.seconds - own, longest)
        if not lease.alive():  # the lease was ended: only the outcomes written after that are durable
            gone = [r for r in rans if r.written and r.lease_gone and r.outcome is not None]
            return BatchRun([r.outcome for r in gone if r.outcome is not None], jobs=[r.claimed for r in gone],
                            handler_seconds=handler_seconds, side_by_side=True)
        out_of_time = False
        for r in rans:
            if r.outcome is None:  # not started: released at the COMMIT
                out_of_time = True
            elif r.written:
                outcomes.append(r.outcome)
                reported.append(r.claimed)
            else:
                done.append((r.claimed, r.attempt, cast(Done, r.outcome).result))
        ran = len(outcomes) + len(done)
        # the handlers' mean time: what the batch's jobs cost one after another (ClaimSize.instant)
        seconds_per_job = (wall + sum(r.took for r in rans)) / ran if ran else None
        started_at = rans[0].claimed.claimed_at  # (the claim's: every job of a batch has it)
        self._commit_batch(lease, batch_id, outcomes, reported, done, started_at, slot, before_commit)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("slot %s: batch %s side by side committed: %d job(s) finished, the last %d side by side",
                      slot, batch_id, len(outcomes), len(rans))
        return BatchRun(outcomes, out_of_time, seconds_per_job, handler_seconds=handler_seconds, jobs=reported,
                        side_by_side=True)

    def _run_jobs(self, lease: "Lease", batch: list[ClaimedJob], slot: str, budget: float,
                  stopping: threading.Event, batch_id: int, suspects: "set[int]",
                  cancels: "dict[int, str]", before_commit: Callable[[], None] | None = None,
                  later: "Later | None" = None) -> BatchRun:
        """The jobs of batch ``batch_id`` (``_run_many``), in order, then its COMMIT. ``later``: a
        batch that would have run side by side but found no slot idle when it began: before each of
        its jobs, if a slot has gone idle since (``Hand.idle``), the jobs left run side by side
        (side_by_side.py) -- no job waits behind its batch-mates while a slot sits idle."""
        started_at = batch[0].claimed_at
        outcomes: list[Outcome] = []
        reported: list[ClaimedJob] = []  # outcomes[i] is reported[i]'s
        done: list[tuple[ClaimedJob, int, str | None]] = []
        if log.isEnabledFor(logging.DEBUG):
            log.debug("slot %s: batch %s of %d job(s) in one transaction (%d suspect(s))", slot, batch_id,
                      len(batch), len(suspects))
        deadline = time.monotonic() + budget
        take_savepoint = lease.savepoint
        out_of_time = False
        began = time.perf_counter()
        for i, claimed in enumerate(batch):
            if i and (time.monotonic() > deadline or stopping.is_set()):
                out_of_time = True
                break
            if later is not None and i and later.hand.idle():
                before = (time.perf_counter() - began, self.handlers.seconds)  # the jobs one after another
                side = self.side.run(self, lease, batch[i:], later.tasks[i:], slot, deadline, stopping, later.hand,
                                     later.carriers)
                if side is not None:
                    return self._side_by_side_ran(lease, batch_id, *side, outcomes, reported, done, slot, before_commit,
                                                  before=before)
            task = self.app.tasks.get(claimed.task)
            attempt = claimed.attempts + 1
            if task is None or self._single_path(claimed, suspects, cancels):
                suspect = claimed.id in suspects
                # A suspect runs alone, its batch's only job: its run is committed here, so that a
                # COMMIT the server refuses (a deferred constraint its handler broke -- maybe what
                # killed its batch) is its failed attempt, with that error (Completer.commit); the
                # batch's row goes in a transaction of its own after it. Left to the batch's COMMIT,
                # the refusal ended every attempt unrecorded, and the job "gave up: none finished".
                outcome = self.run(lease, claimed, slot, batch=batch_id if suspect else None,
                                   commit=suspect and len(batch) == 1)
            else:
                outcome, written = self.in_batch(lease, claimed, task, attempt, slot, started_at, take_savepoint)
                if not written:
                    done.append((claimed, attempt, cast(Done, outcome).result))
                    continue
            if not lease.alive():  # the lease was ended on purpose; only this job's outcome was recorded
                return BatchRun([outcome], jobs=[claimed])
            outcomes.append(outcome)
            reported.append(claimed)
        ran = len(outcomes) + len(done)
        seconds_per_job = (time.perf_counter() - began) / ran if ran else None
        self._commit_batch(lease, batch_id, outcomes, reported, done, started_at, slot, before_commit)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("slot %s: batch %s committed: %d job(s) finished%s", slot, batch_id, len(outcomes),
                      " (out of time: the rest released)" if out_of_time else "")
        return BatchRun(outcomes, out_of_time, seconds_per_job, jobs=reported)

    def in_batch(self, lease: "Lease", claimed: ClaimedJob, task: "Task", attempt: int, slot: str,
                 started_at: datetime, before_conn: Callable[[], None],
                 before_write: Callable[[], None] | None = None) -> tuple[Outcome, bool]:
        """One job of a batch: its handler (``before_conn`` runs at its first read of ``job.conn``: its
        savepoint), then its outcome and whether it was written. A ``Done`` whose handler never
        touched the database is not written (the batch's ``finish_batch`` writes it); any other
        outcome is written at once in the batch's transaction, by its top transaction (the job's
        savepoint, if it has one, released first: ``Completer.write``), ``before_write`` first (side
        by side: the batch's connection lock)."""
        completer = self.completer
        job = make_job(claimed, attempt, slot, lease, before_conn)
        outcome = self.handlers.handle(task, job, claimed, attempt, lease)
        touched = job._before_conn is None
        if isinstance(outcome, Done) and not touched:
            return outcome, False
        if before_write is not None:
            before_write()
        if touched:
            outcome = completer.still_leased(lease, task, attempt, claimed, outcome)
        return completer.write(lease, claimed, attempt, outcome, started_at, slot, touched), True

    def _commit_batch(self, lease: "Lease", batch_id: int, outcomes: list[Outcome], reported: list[ClaimedJob],
                      done: list[tuple[ClaimedJob, int, str | None]], started_at: datetime, slot: str,
                      before_commit: Callable[[], None] | None) -> None:
        """A batch's end: ``before_commit``, then the deferred ``done`` writes with the COMMIT
        (``Completer.finish_batch``); their outcomes and jobs join ``outcomes`` and ``reported``."""
        if before_commit is not None:
            before_commit()
        outcomes.extend(self.completer.finish_batch(lease, batch_id, done, started_at, slot))  # and COMMIT
        reported.extend(claimed for claimed, _, _ in done)

    def run(self, lease: "Lease", claimed: ClaimedJob, slot: str,
            batch: int | None = None, commit: bool = False) -> Outcome:
        """Run one job and write its outcome in the lease transaction, its attempt counted first on
        the bookkeeping session; with ``commit``, a handler's run is committed here
        (``Completer.commit``). Its savepoint is taken when the handler first reads ``job.conn`` (see
        ``savepoint`` in queries.sql for why never before). ``batch``: the job is a suspect running
        alone in that batch's transaction."""
        started_at = claimed.claimed_at  # the database's clock, like finished_at
        backend, write = self.backend, self.completer.write

        attempt, cancel_reason, unrecorded, suspect = self.bookkeeping.run(
            lambda c: backend.start_attempt(c, claimed, slot, lease.session_id, self.alone_in_process, batch),
            again=False)  # (a session lost with the lease: not sent again, see Bookkeeping.run)
        if cancel_reason is not None:
            return write(lease, claimed, attempt - 1, Cancelled(cancel_reason), started_at, slot, False)
        if attempt > claimed.max_attempts:
            if unrecorded is not None:
                # The last attempt did finish, with this error, but its outcome could not be written (its
                # row was still locked): it is failed for that reason (recorded once: it is pending).
                return write(lease, claimed, attempt - 1, Failed(unrecorded), started_at, slot, False)
            error = (
                f"gave up: {attempt - 1} attempt(s) started and none finished; the worker process died or lost its "
                "database connection during each (does the handler crash its worker?)"
            )
            return write(lease, claimed, attempt - 1, Failed(error), started_at, slot, False)
        task = self.app.tasks.get(claimed.task)
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            error = (f"unknown task {claimed.task!r}: no handler is registered under that name in this worker "
                     f"(registered: {known}). The job is kept as failed.")
            return write(lease, claimed, attempt, Failed(error), started_at, slot, False)

        if suspect and not self.alone_in_process:
            # Its last attempt (or its batch) never finished: this one runs alone in the process, and is
            # charged if it never finishes either (see gate.py).
            with self.gate.alone() as alone:
                if not alone:  # never wait at the gate holding a transaction (gate.py): let it go
                    lease.rollback()  # this attempt was never run: it is not charged (start_attempt)
                    raise RunAlone(claimed.id)
                log.info("job %s: its previous run never finished; attempt %s runs alone in this process",
                         claimed.id, attempt)
                self.bookkeeping.run(lambda c: backend.mark_exclusive(c, claimed.id, attempt))
                return self._run_counted(lease, claimed, task, attempt, slot, commit)
        return self._run_counted(lease, claimed, task, attempt, slot, commit)

    def _run_counted(self, lease: "Lease", claimed: ClaimedJob, task: "Task", attempt: int, slot: str,
                     commit: bool) -> Outcome:
        """The handler of a counted attempt, and its outcome written in the lease transaction."""
        completer = self.completer
        started_at = claimed.claimed_at
        if task.timeout is not None:
            if lease.bounded_by_server:
                self.backend.set_local_timeouts(lease, task.timeout)
            elif self.watchdog is not None:
                self.watchdog.watch(lease, task.timeout)
        job = make_job(claimed, attempt, slot, lease, lease.savepoint)
        outcome = self.handlers.handle(task, job, claimed, attempt, lease)
        touched = job._before_conn is None
        if touched:
            outcome = completer.still_leased(lease, task, attempt, claimed, outcome)
        outcome = completer.write(lease, claimed, attempt, outcome, started_at, slot, touched)
        if commit and lease.alive():
            return completer.commit(lease, claimed, task, attempt, outcome, started_at, slot)
        return outcome

    def run_claimed(self, lease: "Lease", claimed: ClaimedJob, task: "Task", slot: str) -> Outcome:
        """Claimed lease (see claimed.py)."""
        return run_claimed(self, lease, claimed, task, slot)
