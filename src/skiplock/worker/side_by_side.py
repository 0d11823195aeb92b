"""Batch-mates side by side: the jobs of one claim start together on the worker's idle slots, inside
the claim's one transaction.

Why. A batch used to run its jobs one after another on its slot: with 1 ms jobs offered at half the
capacity, a claim of eight kept its last job about 9 ms behind its batch-mates while other slots sat
idle (pickup p50 10-19 ms, p99 58-102 ms; docs/benchmarks.md, "Session 24"). Now a batch of jobs that
take a while (``BatchPolicy.runs_side_by_side``: the slot's last batch was not near-instant) is one
queue: the claiming slot and every idle slot it is handed to (``Worker.hand``) take the next job not
yet started, one at a time, until none is left, and before each job each of them hands the queue on
to the slots idle by then. A batch that finds no slot idle when it starts runs one after another on
its slot, without the queue's bookkeeping (a drain's batches almost never find one, and there it was
slower in most alternating pairs: docs/benchmarks.md, "Session 25") -- until a slot goes idle:
before each of its jobs it looks (``Hand.idle``, a read without a lock), and the jobs left then run
as such a queue, so no ready job waits behind its batch-mates while a slot sits idle (before, the
batch kept them all: jobs 21 and later of a claim started 46-54 ms (p90) after it, "Session 31").
While some slot is idle such a claim takes the whole claim size (``plan``; no job waits behind a
batch-mate while a slot is free); with none idle it is sized as before (``BatchPolicy.share``).
Either way: one claim and one COMMIT for the batch.

Guarantees (the executor's are unchanged):

- **The transaction is still the lease**, for every job of the batch: the claim, each handler's
  database work in its savepoint, each outcome and the one COMMIT are in it; a rollback of any kind
  returns every job of the batch.
- **One user of the connection at a time.** A handler's first read of ``job.conn`` takes the batch's
  connection lock, then its savepoint; the lock is held until that job's outcome is written and its
  savepoint released. Handlers that never touch the database run in parallel; the database parts of
  those that do run one after another, each in its own savepoint (never interleaved).
- **At most ``concurrency`` handlers run at once**: the queue is only ever handed to a slot that is
  idle (waiting for a wake-up, or held back by the lease governor, as many of those as its cut took
  away; holding no transaction either way), and a slot runs one handler at a time. While it takes
  jobs from a batch it is not idle: no wake-up and no other hand-off reaches it.
- **Nothing outlives its batch**: the claiming slot waits for every slot the queue was handed to
  before it commits, rolls back or raises (an exception one of them raised -- a cancel that ended the session,
  say -- is raised once all are back).
- The batch's budget still holds: a job not started ``batch_budget`` seconds after the batch began is
  not started, and is released at the COMMIT.

Not side by side (one after another on the claiming slot, as before): near-instant jobs (a hand-off
to another thread costs more than they do; such batches take turns instead, see batching.py), batches
with a suspect, a cancel request or a job that cannot run (unknown task, attempts used up),
flow-controlled batches (a key's flow slots are shared by its jobs in the batch, which must not run at
once), and the asyncio worker. With tracing on, the batch's trace contexts are read on its connection
once, before its first job starts; each job's execute span continues its own enqueuer's trace.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Protocol

from ..job import Done, Outcome

if TYPE_CHECKING:
    from ..app import Task
    from .batching import BatchPolicy, ClaimSize
    from .handler import Handlers
    from ..backend.base import ClaimedJob, Lease
    from .executor import Executor


@dataclass
class Ran:
    """What one job of a side-by-side batch came to: its outcome, whether that outcome was written
    (else: a ``Done`` left for the batch's ``finish_batch``), and whether the lease was gone right
    after the write (then the write was the fresh transaction's: durable, see Completer.write)."""

    claimed: "ClaimedJob"
    attempt: int
    outcome: Outcome | None  # None: not started (the batch's budget ran out first, or stopping)
    written: bool = False
    lease_gone: bool = False
    took: float = 0.0  # handler seconds


class Hand(Protocol):
    """The worker's hand-out for one batch (``loop.BatchHand``)."""

    def __call__(self, most: int, work_for: Callable[[int], Callable[[], None]]) -> int:
        """Hands ``work_for(0)``, ``work_for(1)``, ... to up to ``most`` idle slots; returns how many."""

    def idle(self) -> bool:
        """Some slot could be handed work now (a hint, read without a lock: a hand-out may still find
        none)."""


def no_work(k: int) -> Callable[[], None]:
    """``work_for`` of ``hand(0, no_work)``: a hand-out of nothing (it sends the wake-ups a batch owes)."""
    raise AssertionError("nothing is handed out")


class SideBySide:
    """Runs batches side by side for one worker's slots (see the module docstring)."""

    def run(self, ex: "Executor", lease: "Lease", batch: "list[ClaimedJob]", tasks: "list[Task]", slot: str,
            deadline: float, stopping: threading.Event, hand: Hand,
            carriers: "dict[int, dict[str, str]] | None" = None) -> tuple[list[Ran], float] | None:
        """Run ``batch`` (``tasks[i]`` is ``batch[i]``'s) as one queue of jobs, in batch order: this
        thread and every idle slot it is handed to (``hand``: the worker's; it returns how many it
        could hand) take the next job not yet started, one at a time, until none is left; before each
        job it takes, each of them hands the queue to the slots idle by then, so a slot that goes
        idle while jobs wait takes one. Returns every job's ``Ran``, in batch order, and the most
        handler time one of the slots it was handed to spent (this thread's own is in its
        ``handlers.seconds``), once every slot it was handed to is back; an exception one of them
        raised is raised then (the others take no further job after it). None, having run nothing: no
        slot was idle to take a job when it began (the caller then runs the batch one after another,
        without the queue's bookkeeping, and calls this again for the jobs left once ``hand.idle()``
        says a slot went idle: see the module docstring).
        ``carriers``: the batch's trace contexts (tracing on; this thread's are the caller's to set)."""
        lock = threading.Lock()  # the batch's connection: see _one
        started_at = batch[0].claimed_at
        handlers = ex.handlers
        results: list[Ran | None] = [None] * len(batch)
        waiting = deque(range(len(batch)))  # not started yet
        helpers: list[Future[list[int]]] = []
        stop: list[BaseException] = []

        def take() -> int | None:
            try:
                return None if stop else waiting.popleft()  # (deque.popleft is atomic)
            except IndexError:
                return None

        def run_queue(mine: list[int]) -> None:
            while True:
                if waiting and not stop:
                    hand(len(waiting), helping)
                i = take()
                if i is None:
                    return
                try:
                    results[i] = self._one(ex, lease, batch[i], tasks[i], slot, started_at, lock, deadline,
                                           stopping)
                except BaseException as exc:
                    stop.append(exc)
                    raise
                mine.append(i)

        def helping(k: int) -> Callable[[], None]:
            future: Future[list[int]] = Future()
            helpers.append(future)

            def work() -> None:  # on the idle slot's thread; never raises
                handlers.reset()  # this thread's handler time and runs: handed back in each Ran
                handlers.use_trace_contexts(carriers)
                mine: list[int] = []
                try:
                    run_queue(mine)
                    future.set_result(mine)
                except BaseException as exc:  # noqa: BLE001 - the batch's slot raises it
                    future.set_exception(exc)
                finally:
                    handlers.use_trace_contexts(None)
            return work

        if not hand(len(waiting), helping):
            return None  # no slot idle: nothing was handed, nothing run
        try:
            run_queue([])
        except BaseException:
            try:  # every slot handed the queue is back before anything else happens to the lease
                self._join(helpers, handlers)
            except BaseException:  # noqa: BLE001 - this thread's own exception goes up, not a helper's
                pass
            raise
        longest = self._join(helpers, handlers, results)
        return [r for r in results if r is not None], longest

    @staticmethod
    def _join(helpers: "list[Future[list[int]]]", handlers: "Handlers",
              results: "list[Ran | None] | None" = None) -> float:
        """Wait for every slot the queue was handed to (more may join while it waits: each one that
        runs a job may hand it on); their jobs' handler times go to this thread's ``handlers.ran``.
        Then raise the first exception one of them raised, if any; else return the most handler time
        one of them spent."""
        error: BaseException | None = None
        longest = 0.0
        n = 0
        while n < len(helpers):
            future = helpers[n]
            n += 1
            try:
                ran = future.result()
            except BaseException as exc:  # noqa: BLE001 - raised once all are back
                error = error or exc
                continue
            if results is not None:
                spent = 0.0
                for i in ran:
                    r = results[i]
                    if r is not None and r.outcome is not None:
                        handlers.ran[r.claimed.id] = (r.attempt, r.took)
                        spent += r.took
                longest = max(longest, spent)
        if error is not None:
            raise error
        return longest

    @staticmethod
    def _one(ex: "Executor", lease: "Lease", claimed: "ClaimedJob", task: "Task", slot: str,
             started_at: datetime, lock: threading.Lock, deadline: float, stopping: threading.Event) -> Ran:
        """One job of the batch: its handler, and (unless it is a ``Done`` that never touched the
        database) its outcome written at once, under the batch's connection lock."""
        attempt = claimed.attempts + 1
        if time.monotonic() > deadline or stopping.is_set():
            return Ran(claimed, attempt, None)
        holding = False

        def take_lock() -> None:
            nonlocal holding
            if not holding:
                lock.acquire()
                holding = True

        def before_conn() -> None:  # the handler's first read of job.conn: the lock, then its savepoint
            take_lock()
            lease.savepoint()

        began = time.perf_counter()
        try:
            outcome, written = ex.in_batch(lease, claimed, task, attempt, slot, started_at, before_conn, take_lock)
            took = time.perf_counter() - began
            if not written:
                return Ran(claimed, attempt, outcome, took=took)
            return Ran(claimed, attempt, outcome, written=True, lease_gone=not lease.alive(), took=took)
        finally:
            if holding:
                lock.release()


def plan(policy: "BatchPolicy", size: "ClaimSize") -> bool:
    """Whether a claim of ``size`` runs its batch side by side: its claim then takes the whole claim
    size (no ``batch_wait`` share: its jobs wait for no batch-mate while a slot is idle), and the
    jobs are handed to the slots idle while it runs. Not for a claim of one job, and only where
    ``BatchPolicy.runs_side_by_side`` says so."""
    return size.value > 1 and policy.runs_side_by_side(size)
