"""Batching, in one place: which jobs may share a lease transaction, how many one claim takes, and
how many slots run batches at once.

A batch is several jobs claimed by one statement and run in that claim's transaction -- side by
side on the process's idle slots when they are not near-instant (worker/side_by_side.py), else one
after another -- each in its own savepoint when its handler touches the database, with one COMMIT for
all (``Executor.run_batch``). What decides it lives here, in :class:`BatchPolicy`, which a worker
takes as ``batch_policy=`` (tests and special deployments steer batching through it, never by
patching internals):

- **which jobs run alone** (``alone``): claimed-lease tasks (they commit the claim), tasks with a
  ``timeout`` (a timeout ends the whole session), and tasks not (yet) measured fast -- a handler
  that has not run in this worker, or whose recent runs took more than ``fast_seconds``
  (``batch_budget / 4``: at least four of its jobs fit in a batch) at their first quartile (of its last ``RUNS_KEPT``: runs stretched by a
  machine short of CPU do not make a fast task slow): a slow job in a batch would hold its
  batch-mates' locks while it runs;
- **how many jobs a claim takes** (:class:`ClaimSize`, one per slot): starts at 1 and doubles up to
  ``batch_size`` while whole batches run within ``batch_budget``;
- **how many slots run batches of near-instant jobs at once** (``batch_slots`` turns): such a batch
  is all claim, lock and commit, and every row it holds is one more that every other claimer must
  step over, so they take turns (docs/batches.md has the measurements). Flow-controlled batches
  (worker/flow.py) take turns of their own (``flow_batch_slots``): their claim costs the server
  several times a plain one, and with one turn a process's slots waited for it instead of running
  another batch's handlers meanwhile.

Guarantees: nothing here changes what a job's outcome is or when it commits relative to its
handler; a policy only chooses claim sizes and which jobs share a transaction. A turn held longer
than ``stuck_after`` (a hung handler in a batch) never stops the process's other slots: they claim
one job at a time meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable

if TYPE_CHECKING:
    from ..app import Task
    from ..backend.base import ClaimedJob
    from ..job import Outcome

# Measured with `python -m bench` (docs/benchmarks.md): drain throughput per batch size 8 / 16 / 32 / 64
# was 1.1 / 1.8 / 3.2 / 3.8 x the pgbench baseline. 32 keeps a batch within the 64 subtransaction
# ids PostgreSQL caches per transaction even when every handler writes (one savepoint each).
DEFAULT_BATCH_SIZE = 32
# Seconds after which a batch starts no further job; a quarter of it decides which tasks are fast
# (FAST_SHARE). 0.05 s until session 30: in three runs with running workers (`python -m bench --only
# sweep`, 1 x 16) 0.1 s drained jobs that write through job.conn 1.04-1.22 x as fast, 0 and 1 ms jobs
# within noise (0.90-1.14), and pickup at half the capacity was no worse (docs/benchmarks.md, "Session 30").
DEFAULT_BATCH_BUDGET = 0.1
# While other slots are idle, a claim takes no more jobs than start within this many seconds of it
# (BatchPolicy.share).
DEFAULT_BATCH_WAIT = 0.016
# Turns for batches of flow-controlled jobs, shared by the live worker processes of a database
# (BatchPolicy.live_processes): each has ceil(FLOW_TURNS / processes), at least one. 1 process x 8
# slots, `python -m bench --only flow`, three alternating rounds: limits 5,403 / 6,732 / 7,869 / 7,617
# jobs/s and fair 5,788 / 7,470 / 8,443 / 7,578 with 1 / 2 / 3 / 4 turns; 4 processes x 8 slots lost
# about a tenth with 2 or 3 turns each against 1 (docs/benchmarks.md, "Session 20").
FLOW_TURNS = 3
# How many of a task's recent handler times decide whether it is fast (their first quartile).
RUNS_KEPT = 15
# A task is fast (batched) when at least this many of its jobs fit in one batch budget. A job claimed
# alone costs a claim, a COMMIT and their round trips, and on a virtual machine each round trip that
# follows an idle wait costs several times its CPU (measured here: 64 µs of client CPU for a prepared
# SELECT run back to back, 418 µs after a 10 ms sleep). With a tenth of the budget (5 ms), 10 ms jobs ran
# alone: 1 process x 16 / 64 / 256 slots drained 3,000 of them at 266 / 453 / 412 jobs/s; batched (a
# quarter: 12.5 ms), at 590 / 636 / 894 (docs/benchmarks.md, "Session 14").
FAST_SHARE = 4


def power_of_two_below(n: int) -> int:
    """The largest power of two <= ``n``, at least 1 (claim sizes: see ``ClaimSize``)."""
    return 1 << (max(1, n).bit_length() - 1)


class _TurnWaiter:
    __slots__ = ("event", "key", "granted")

    def __init__(self, key: Hashable) -> None:
        self.event = threading.Event()
        self.key = key
        self.granted = False


class Turns:
    """At most ``limit`` holders at once, a limit that may change while they hold (a semaphore whose
    size moves: a lower limit lets no new holder in until enough have given theirs back).

    A turn given back while others wait passes straight to the waiter whose ``key`` (the slot) gave
    one back most recently -- last in, first out, as idle slots are woken (``Worker.wake``) -- not to
    the one that waited longest. First come, first served (a condition variable's order) handed one
    turn round every slot in order: with 16 slots each batch of near-instant jobs was claimed by a
    thread, and on a server session, that had sat out the fifteen batches before it (each slot's
    session also planned the claim for every claim size). Now the few slots that take turns -- one
    claims while another commits, a third or fourth while a COMMIT takes longer than a batch --
    keep them, and the others wait: the jobs are the queue's whichever slot claims them. Measured,
    no-op jobs on 1 x 16 slots: server CPU per job 60-84 µs against 77-92 before, throughput 1.01-1.48
    x in six alternating pairs (docs/benchmarks.md, "Session 31").
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()
        self._waiters: list[_TurnWaiter] = []
        self._given_back: dict[Hashable, int] = {}  # key -> when it last gave a turn back (a count)
        self._count = 0

    def acquire(self, timeout: float, key: Hashable = None) -> bool:
        with self._lock:
            if self.held < self.limit:
                self.held += 1
                return True
            waiter = _TurnWaiter(key)
            self._waiters.append(waiter)
        waiter.event.wait(timeout)
        with self._lock:
            if waiter.granted:  # (also when it was handed over just as the wait timed out)
                return True
            self._waiters.remove(waiter)
            return False

    def release(self, key: Hashable = None) -> None:
        with self._lock:
            if self.held <= 0:
                raise ValueError("a turn given back that was not taken")
            self._count += 1
            self._given_back[key] = self._count
            if self._waiters and self.held <= self.limit:
                self._hand_over()  # the turn passes on: as many held as before
            else:
                self.held -= 1

    def resize(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            while self.held < self.limit and self._waiters:
                self.held += 1
                self._hand_over()

    def _hand_over(self) -> None:
        """Grant a turn to the waiter that gave one back last (called with the lock held)."""
        given_back = self._given_back
        waiter = max(self._waiters, key=lambda w: given_back.get(w.key, -1))
        self._waiters.remove(waiter)
        waiter.granted = True
        waiter.event.set()


@dataclass
class BatchRun:
    """What one claim's transaction did: the durable outcomes, and whether it stopped starting jobs
    because its time budget ran out (or the worker is stopping) before all of them had run."""

    outcomes: "list[Outcome]"
    out_of_time: bool = False
    seconds_per_job: float | None = None  # a batch's mean time per job, its claim and COMMIT left out
    alone: bool = False  # the claim's first job had to run alone (see Executor.alone)
    handler_seconds: float = 0.0  # time spent in handlers (the rest of the lease is skiplock's overhead)
    jobs: "list[ClaimedJob] | None" = None  # jobs[i]'s outcome is outcomes[i] (what the reporter reports)
    side_by_side: bool = False  # its jobs ran side by side (handler_seconds: the wall time they took together)



class ClaimSize:
    """How many jobs one slot claims at once: starts at 1 and doubles up to ``maximum`` while whole
    batches run within their time budget; falls to what fitted when the budget runs out (rounded
    down to a power of two: PostgreSQL keeps a plan per claim size, see ``with_limit`` in
    backend/postgres/queries.py), and to 1 when the first job claimed must run alone (a slow, timed
    or claimed-lease task). So fast jobs are
    claimed in batches (one commit for many), while slow jobs are claimed one at a time and no slot
    sits on jobs it is not running while other slots are idle.

    ``instant``: this slot's last batch averaged under ``instant_seconds`` per job; such batches take
    turns (see the module docstring). Batches of jobs that take longer (waiting on I/O, say) run on
    every slot at once."""

    def __init__(self, maximum: int, instant_seconds: float, start: int = 1):
        self.maximum = maximum
        self.instant_seconds = instant_seconds
        self.value = max(1, min(maximum, start))
        self.instant = True
        self.per_job: float | None = None  # the last batch's mean time per job (seconds), if measured

    def after(self, claimed: int, run: "BatchRun") -> None:
        if run.alone:  # slow (or not yet measured) jobs: keep claiming one at a time
            self.value = 1
        elif run.out_of_time:  # what fitted, as a power of two (the claim sizes the database keeps plans for)
            self.value = power_of_two_below(len(run.outcomes))
        elif claimed >= self.value:
            self.value = min(self.maximum, self.value * 2)
        if run.seconds_per_job is not None:
            self.instant = run.seconds_per_job < self.instant_seconds
            self.per_job = run.seconds_per_job

    def alone(self) -> None:
        self.value = 1


class BatchPolicy:
    """The batching decisions of one worker (see the module docstring). Shared by its slots.

    ``batch_size``: the most jobs one claim takes (1: one job per transaction); ``batch_budget``:
    seconds after which a batch starts no further job (its remaining jobs are released at its
    COMMIT); ``batch_slots``: how many slots may run batches of near-instant jobs at the same time,
    and ``flow_batch_slots`` how many may run such batches of flow-controlled jobs (turns of their
    own, besides ``batch_slots``; None: ``FLOW_TURNS`` shared by the live worker processes, see
    ``live_processes``); ``instant_seconds``: the mean time per job under which a batch counts as near-instant;
    ``side_by_side``: a batch that is not near-instant runs its jobs at the same time on the worker's idle
    slots (worker/side_by_side.py), else one after another."""

    def __init__(self, batch_size: int = DEFAULT_BATCH_SIZE, batch_budget: float = DEFAULT_BATCH_BUDGET, batch_slots: int = 1, *,
                 batch_wait: float | None = DEFAULT_BATCH_WAIT, instant_seconds: float = 0.0005,
                 flow_batch_slots: int | None = None, side_by_side: bool = True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ValueError(f"batch_size must be an integer from 1 to 1000, got {batch_size!r}")
        if isinstance(batch_budget, bool) or not isinstance(batch_budget, (int, float)) or not 0 < batch_budget <= 60:
            raise ValueError(f"batch_budget must be a number of seconds in (0, 60], got {batch_budget!r}")
        if isinstance(batch_slots, bool) or not isinstance(batch_slots, int) or batch_slots < 1:
            raise ValueError(f"batch_slots must be a positive integer, got {batch_slots!r}")
        if flow_batch_slots is not None and (isinstance(flow_batch_slots, bool) or not isinstance(flow_batch_slots, int)
                                             or flow_batch_slots < 1):
            raise ValueError(f"flow_batch_slots must be a positive integer or None, got {flow_batch_slots!r}")
        if batch_wait is not None and (isinstance(batch_wait, bool) or not isinstance(batch_wait, (int, float))
                                       or not 0 < batch_wait <= 60):
            raise ValueError(f"batch_wait must be a number of seconds in (0, 60] or None, got {batch_wait!r}")
        self.batch_size = batch_size
        self.batch_budget = float(batch_budget)
        self.batch_slots = batch_slots
        self.flow_batch_slots = flow_batch_slots
        self.batch_wait = None if batch_wait is None else float(batch_wait)
        self.instant_seconds = instant_seconds
        self.side_by_side = bool(side_by_side)
        self.fast_seconds = self.batch_budget / FAST_SHARE
        # A batch turn held this long is stuck (a batch of near-instant jobs takes milliseconds).
        self.stuck_after = max(1.0, 20 * self.batch_budget)
        self._runs: dict[str, deque[float]] = {}  # per task: its handler's last RUNS_KEPT run times
        self._runs_lock = threading.Lock()  # measured() runs on idle slots too (side_by_side.py; free-threaded Python)
        self._seconds: dict[str, float] = {}  # per task: their first quartile
        self._turns = Turns(batch_slots)
        self._flow_turns = Turns(FLOW_TURNS if flow_batch_slots is None else flow_batch_slots)
        # slot index -> when it took its batch turn, and which turns it came from
        self._turns_taken: dict[int, tuple[float, Turns]] = {}

    # ---- which jobs share a transaction ---------------------------------------------------------

    def claim_size(self) -> ClaimSize:
        """A new slot's claim size."""
        return ClaimSize(self.batch_size, self.instant_seconds)

    def alone(self, task: "Task | None") -> bool:
        """Whether a job of ``task`` must not share a transaction with other jobs (see the module
        docstring). An unknown task (None) may: its job is failed at once, without a handler."""
        if task is None:
            return False
        if task.lease == "claimed" or task.timeout is not None:
            return True
        seconds = self._seconds.get(task.name)
        return seconds is None or seconds > self.fast_seconds

    def measured(self, task: str, seconds: float) -> None:
        """A handler of ``task`` ran for ``seconds`` (the first quartile of its last runs decides
        ``alone``). Not a mean: on a machine short of CPU a 1 ms handler often takes tens of
        milliseconds of wall time (it waits for a core, and for the GIL, after its I/O), and a mean
        then sent every job of the task to run alone, one transaction each -- more CPU per job, so
        longer waits, so more jobs alone: measured, 8 processes x 8 slots of 1 ms jobs on 2 cores ran
        two thirds of their claims alone. A task is slow when most of its runs are, not a few."""
        with self._runs_lock:
            runs = self._runs.get(task)
            if runs is None:
                runs = self._runs[task] = deque(maxlen=RUNS_KEPT)
            runs.append(seconds)
            self._seconds[task] = sorted(runs)[len(runs) // 4]

    def runs_side_by_side(self, size: ClaimSize) -> bool:
        """Whether a claim of ``size`` runs its batch side by side (worker/side_by_side.py): on, and
        the slot's last batch was measured and not near-instant (a hand-off to another thread costs
        more than a near-instant job)."""
        return self.side_by_side and size.per_job is not None and not size.instant

    def share(self, size: ClaimSize, idle_slots: int) -> int:
        """How many jobs this claim takes: ``size.value`` -- or, while ``idle_slots`` other slots of
        the process sit idle and could claim, no more than start within ``batch_wait`` seconds of it, judged
        by this slot's last time per job (rounded down to a power of two, at least one). A batch runs
        its jobs one after another, so a burst claimed whole by one slot kept its last jobs waiting
        behind their batch-mates while other slots had nothing to do (1 ms jobs offered at half the
        capacity: 17-18 jobs per claim, 11.8 ms from claim to handler at the median; docs/batches.md,
        "Idle slots"). A claim that comes back full wakes two more slots (the worker), so the
        burst spreads over idle slots. With every slot busy a claim takes ``size.value``: the
        jobs would wait for a slot anyway, and one commit for many is what keeps up with a backlog."""
        limit = size.value
        wait, per_job = self.batch_wait, size.per_job
        if wait is None or idle_slots <= 0 or per_job is None or per_job <= 0 or limit <= 1:
            return limit
        fits = int(wait / per_job) + 1  # the first starts at once, the last `wait` later
        if fits >= limit:
            return limit
        return power_of_two_below(fits)

    # ---- turns ----------------------------------------------------------------------------------

    def take_turn(self, index: int, stopping: threading.Event, flow: bool = False) -> bool:
        """Wait for a turn to claim a batch (``batch_slots``; ``flow_batch_slots`` for a batch of
        flow-controlled jobs). False if ``stopping`` is set, or if a turn of the same kind has been
        held for more than ``stuck_after`` seconds -- far longer than a batch of near-instant jobs
        takes (a hung handler, say): slot ``index`` then claims one job at a time meanwhile, so one
        stuck batch never stops the process's other slots."""
        turns = self._flow_turns if flow else self._turns
        while not stopping.is_set():
            if turns.acquire(timeout=0.05, key=index):
                self._turns_taken[index] = (time.monotonic(), turns)
                return True
            oldest = min((at for at, kind in list(self._turns_taken.values()) if kind is turns), default=None)
            if oldest is not None and time.monotonic() - oldest > self.stuck_after:
                return False
        return False

    def live_processes(self, processes: int) -> None:
        """``processes`` live worker processes (this one included) claim from the same database: with
        ``flow_batch_slots`` None, this process's flow turns are its share of ``FLOW_TURNS`` (rounded
        up, at least one). A flow claim costs the server several times a plain one, and one process
        with a single turn left the machine idle while its slots waited for it; but every process with
        several turns made more batches step over each other's rows than the server gained."""
        if self.flow_batch_slots is None:
            self._flow_turns.resize(max(1, -(-FLOW_TURNS // max(1, processes))))

    def give_turn(self, index: int) -> None:
        """Give back the turn slot ``index`` took (of whichever kind)."""
        _, turns = self._turns_taken.pop(index)
        turns.release(index)


class WholeBatches(BatchPolicy):
    """Every claim takes ``batch_size`` jobs from the first on, and every task counts as fast (only
    claimed-lease and timed tasks run alone): batches are exactly jobs 1..N, N+1..2N, ... of the queue,
    run one after another unless ``side_by_side=True`` (then, measured or not, a claim takes one job for
    its slot and one per idle slot, and they start together). For tests and benchmarks that need
    batches of a known shape."""

    def __init__(self, batch_size: int = DEFAULT_BATCH_SIZE, batch_budget: float = DEFAULT_BATCH_BUDGET, batch_slots: int = 1, *,
                 side_by_side: bool = False, **options: Any):
        super().__init__(batch_size, batch_budget, batch_slots, side_by_side=side_by_side, **options)

    def claim_size(self) -> ClaimSize:
        return ClaimSize(self.batch_size, self.instant_seconds, start=self.batch_size)

    def alone(self, task: "Task | None") -> bool:
        return task is not None and (task.lease == "claimed" or task.timeout is not None)

    def runs_side_by_side(self, size: ClaimSize) -> bool:
        return self.side_by_side  # measured or not
