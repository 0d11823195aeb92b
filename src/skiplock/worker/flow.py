"""The worker's flow claim (docs/flow-control.md): jobs whose task has limits in this worker's code,
or whose queue has limits in the database, are claimed here, never by the plain claim -- up to the
slot's claim size at once (a batch, as the plain claim's, sharing one transaction and one COMMIT).

One claim round, in a fresh lease transaction each try (``claim_flow_many``, ``claim_flow`` in
backend/postgres/queries.sql):

1. lock up to ``limit`` available flow-controlled jobs and one free slot of each of their concurrency
   keys, shared by the batch's jobs of that key -- they run one after another, never two at once
   (one statement);
2. keep the jobs that got every slot; the others stay locked, untouched, until the transaction ends.
   None kept: roll back (no attempt used) and try again without the keys found full this round --
   without waiting on anything (SKIP LOCKED throughout). A key whose slot rows do not exist yet (a
   new partition, a raised limit) gets them, created once on the bookkeeping session (no rollback
   when other jobs were kept: the next claim finds them; a fair batch is rolled back and taken again
   from the same place, so a new partition keeps its turn);
3. a job with a rate is kept only first and alone: one start of every rate key of the job, all or
   none, on the bookkeeping session (``take_starts``: a short autocommit statement); refused, roll
   back and hold that key back in this process until its next start is due (no slot polls for it
   before then: an idle slot's wait ends at the earliest such time, see ``next_due``).

"Roll back" above is ``Lease.let_go``: a COMMIT, as the transaction wrote nothing (it only locked
rows, released alike); after a ROLLBACK psycopg drops the connection's prepared statements, and the
claims after it were planned anew (a flow claim's plan costs 0.4-0.6 ms of server CPU).

So at most N jobs of a key with ``concurrency=N`` hold its slots, and a held-back job is neither
failed nor charged an attempt.

A fair queue (``queue_limits.fair``) is claimed round-robin across its partitions first
(``claim_flow_fair``): each process keeps the partition it claimed from last, per queue, and the
next claim takes the first partition after it (wrapping round); a partition found full or held back
is stepped over the same way (one index descent, not a scan of its jobs). A batch from a fair queue
without weights (``claim_flow_fair_many``) takes one job from each of the next ``limit`` partitions. Queue limits are read by every claim (live); which queues have limits
is also kept here, refreshed at most every ``REFRESH_SECONDS``, to know which flow claims to run."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..backend.base import ClaimedJob, FlowKey, TaskLimits
from ..errors import ConfigurationError
from ..flow import NOT_SUPPORTED

if TYPE_CHECKING:
    from ..app import App
    from ..backend.base import Lease
    from .bookkeeping import Bookkeeping

# How often a worker re-reads which queues have limits (each claim reads the limits themselves).
REFRESH_SECONDS = 1.0
# Tries of one claim round (each rules out the keys found full): then the round reports nothing.
MAX_TRIES = 16
# After the claim of the task limits' jobs over the worker's queues found nothing, it goes after the
# limited queues' claims for this long, doubling while it keeps finding nothing, up to TASKS_REST_MAX
# (a job of a task with limits waits at most about that long behind a limited queue's backlog).
TASKS_REST_SECONDS = 0.05
TASKS_REST_MAX = 0.25


class FlowControl:
    """One worker's flow claim; shared by its slots (the held-back keys are per process)."""

    def __init__(self, app: "App", queues: Sequence[str] | None, fail_unknown_tasks: bool):
        self.app = app
        self.backend: Any = app.backend
        self.queues = None if queues is None else list(queues)
        tasks = app.tasks.values()
        # the code's limits; a task's row in task_limits (runtime, migration 16) replaces them
        self._code = {t.name: (t.concurrency, None if t.rate is None else t.rate[1] / t.rate[0]) for t in tasks}
        self._runtime: dict[str, tuple[int | None, float | None]] = {}
        self.limits: list[TaskLimits] = []
        self.limited_tasks: list[str] = []
        self.unlimited_tasks: list[str] = []
        self.all_tasks: list[str] = []
        self._turn = 0  # the limited queue the flow claim tried first last time (an index)
        self._tasks_empty = 0  # the task limits' claims in a row that found nothing (the process's)
        self._tasks_rest_until = 0.0  # that claim goes last until then (monotonic time)
        self._apply_task_limits()
        self.supported = self.backend.capabilities.flow_control
        if self.limits and not self.supported:
            raise ConfigurationError(f"task limits (concurrency, rate, partition_by: {', '.join(self.limited_tasks)}) "
                                     f"{NOT_SUPPORTED}")
        sequenced = sorted(t.name for t in tasks if t.sequence_by is not None)
        if sequenced and not self.supported:
            raise ConfigurationError(f"task sequences (sequence_by: {', '.join(sequenced)}) {NOT_SUPPORTED}")
        if self.limits and fail_unknown_tasks:
            raise ConfigurationError("fail_unknown_tasks cannot be combined with task limits (concurrency, rate, "
                                     f"partition_by: {', '.join(self.limited_tasks)}): such a worker claims every task")
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}  # rate-limited key -> monotonic time its next start is due
        self._limited_queues: list[str] = []
        self._fair_queues: list[str] = []
        self._weights: dict[str, dict[str, int]] = {}  # fair queue -> {partition: weight} (absent: 1)
        self._served: dict[str, tuple[str | None, int]] = {}  # fair queue -> (partition, claims in a row)
        self._cursor: dict[str, str | None] = {}  # fair queue -> the partition claimed from last
        # slot -> its last fair batch: (queue, cursor before, cursor after, [(job id, partition)] in
        # partition order), until the slot says which of its jobs ran (``batch_ran``)
        self._fair_batches: dict[int | None, tuple[str, str | None, str, list[tuple[int, str | None]]]] = {}
        self._read_at = float("-inf")
        self._waker: int | None = None  # the slot woken when the next held-back start is due
        # slots whose last claim that took a job took one with a rate (alone): they claim one job
        # at a time until they take one without (worker/claiming.py)
        self.rated_slots: set[int | None] = set()

    # ---- what to claim ---------------------------------------------------------------------------

    def _apply_task_limits(self) -> None:
        """The effective task limits: each task's runtime row if it has one, else its code's. A task
        with none (and no partition_by) is claimed by the plain claim; the lists are rebound, never
        changed in place (the claims read them from other threads)."""
        limits = []
        for name, task in self.app.tasks.items():
            concurrency, every = self._runtime.get(name, self._code[name])
            if concurrency is not None or every is not None or task.partition_by is not None:
                limits.append(TaskLimits(name, concurrency, task.partition_by, every))
        self.limits = limits
        self.limited_tasks = sorted(t.task for t in limits)
        self.unlimited_tasks = sorted(set(self.app.tasks) - set(self.limited_tasks))
        self.all_tasks = sorted(self.app.tasks)

    def limited_queues(self) -> list[str]:
        """This worker's queues that have limits now, and its tasks' runtime limits (both re-read at
        most every REFRESH_SECONDS)."""
        if not self.supported:
            return []
        now = time.monotonic()
        if now - self._read_at >= REFRESH_SECONDS:
            # with the rows left without limits: their queues' flagged jobs are this claim's to run
            # until the row goes (migration 17)
            rows = [r for r in self.backend.queue_limits(retiring=True)
                    if self.queues is None or r[0] in self.queues]
            runtime = {r[0]: (r[1], None if r[2] is None else r[3] / r[2])
                       for r in self.backend.task_limits() if r[0] in self.app.tasks}
            with self._lock:
                self._limited_queues = [r[0] for r in rows]
                self._fair_queues = [r[0] for r in rows if r[5]]
                self._weights = {r[0]: dict(r[6] or {}) for r in rows if r[5]}
                if runtime != self._runtime:
                    self._runtime = runtime
                    self._apply_task_limits()
                self._read_at = now
        return self._limited_queues

    def active(self) -> bool:
        return bool(self.limits) or bool(self.limited_queues())

    def next_due(self, slot: int | None = None) -> float | None:
        """Seconds until the earliest held-back key may start again (None: none held) -- for the
        one slot of this process that last found a key held back (``slot``; any slot if None): the
        others keep their usual wait, so a due start wakes one slot per process, not all of them."""
        with self._lock:
            if not self._held or (slot is not None and slot != self._waker):
                return None
            return max(0.0, min(self._held.values()) - time.monotonic())

    def holding(self) -> bool:
        """Some key is held back by its rate in this process (its jobs are not "none available")."""
        return bool(self._held_now())

    def _held_now(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            for key in [k for k, until in self._held.items() if until <= now]:
                del self._held[key]
            return list(self._held)

    def _ruled_out(self) -> tuple[list[str], list[str], list[str]]:
        """The queues, tasks and other keys held back now (``_hold``), as the claim round leaves them out."""
        held_queues: list[str] = []
        held_tasks: list[str] = []
        held_keys: list[str] = []
        for key in self._held_now():
            _rule_out(key, held_queues, held_tasks, held_keys)
        return held_queues, held_tasks, held_keys

    def _hold(self, waits: dict[str, float], slot: int | None) -> None:
        now = time.monotonic()
        with self._lock:
            self._waker = slot
            for key, seconds in waits.items():
                self._held[key] = max(self._held.get(key, 0.0), now + max(seconds, 0.0))

    # ---- claiming --------------------------------------------------------------------------------

    def claim(self, lease: "Lease", bookkeeping: "Bookkeeping", slot: int | None = None,
              limit: int = 1, alone: Callable[[str], bool] | None = None) -> list[ClaimedJob]:
        """Flow-controlled jobs locked in a new transaction of ``lease`` with their slots -- up to
        ``limit`` (a batch) from the ordinary flow claim or a fair queue without weights, one from a
        weighted fair queue's, one with a rate (its starts taken) -- or [] with no transaction open
        (nothing available, or all held back). ``alone(task)``: a fair batch whose first job must run
        alone is let go here and one job claimed instead, from the same place in the round (the
        caller lets go the ordinary claim's batches: they move no cursor)."""
        self._fair_batches.pop(slot, None)  # a record of a batch never run (let go in claiming.py)
        plans: list[tuple[list[str] | None, list[str]]] = []
        limited_queues = self.limited_queues()  # (also re-reads the task limits, used just below)
        tasks_plan = (self.queues, self.limited_tasks) if self.limits else None
        for queue in self._fair_queues:
            if limit > 1 and not self._weights.get(queue):
                jobs = self._fair_batch(lease, bookkeeping, queue, slot, limit, alone)
                if jobs:
                    return jobs
                continue
            job = self._fair_round(lease, bookkeeping, queue, slot)
            if job is not None:
                return [job]
        # A limited queue's jobs, one queue at a time: its flagged jobs (migration 17) are not on the
        # index of the claim over several queues or every queue above (`claim_flow`,
        # jobs_claim_any_idx), so this claim (`claim_flow_of_queue`, jobs_claim_idx: the queue's
        # every job, flagged or not) takes them -- of every task, unless the claim above was this
        # one queue's already (a worker of one queue: its limited tasks' jobs were walked there).
        one_queue = self.queues is not None and len(self.queues) == 1
        queue_tasks = self.unlimited_tasks if one_queue and self.limits else self.all_tasks
        if queue_tasks and limited_queues:
            # each claim starts at the next queue, so that one queue's backlog does not keep the
            # others' jobs waiting (their order across queues is not the claim index's any more)
            self._turn = start = (self._turn + 1) % len(limited_queues)
            plans.extend(([q], queue_tasks) for q in limited_queues[start:] + limited_queues[:start])
        now = time.monotonic()
        if tasks_plan is not None:
            # The task limits' claim goes first, but for a rest after it found nothing (the process's,
            # doubling from TASKS_REST_SECONDS up to TASKS_REST_MAX while it keeps finding nothing):
            # an empty claim first is a round trip more for every claim (measured: a `limits` drain,
            # whose jobs are all a limited queue's, made one per batch), and always last would leave
            # its jobs waiting for as long as the limited queues' claims find work.
            plans.insert(0 if now >= self._tasks_rest_until else len(plans), tasks_plan)
        for plan in plans:
            jobs = self._claim_round(lease, bookkeeping, *plan, slot, limit)
            if plan is tasks_plan:
                self._tasks_empty = 0 if jobs else self._tasks_empty + 1
                self._tasks_rest_until = 0.0 if jobs else now + min(
                    TASKS_REST_SECONDS * 2 ** min(self._tasks_empty - 1, 8), TASKS_REST_MAX)
            if jobs:
                return jobs
        return []

    def _claim_round(self, lease: "Lease", bookkeeping: "Bookkeeping", queues: list[str] | None,
                     tasks: list[str], slot: int | None, limit: int = 1) -> list[ClaimedJob]:
        backend = self.backend
        held_queues, held_tasks, held_keys = self._ruled_out()
        for _ in range(MAX_TRIES):
            # A queue or task held back leaves the lists the scan walks (index conditions), so a full
            # one costs the next try nothing; only a worker serving every queue filters them per row.
            tasks = [t for t in tasks if t not in held_tasks]
            if queues is not None:
                queues = [q for q in queues if q not in held_queues]
            if not tasks or queues == []:
                return []
            lease.begin()
            try:
                got = backend.claim_flow_many(lease, limit, queues, tasks, self.limits, held_queues, held_tasks,
                                              held_keys)
            except BaseException:
                lease.rollback()
                raise
            if not got:
                lease.let_go()
                return []
            taken, rated, missing, full = _pick(got)
            if missing:  # created once, on the bookkeeping session (never in a lease)
                bookkeeping.run(lambda c: backend.ensure_slots(c, list(missing.items())))
            if not taken:
                lease.let_go()
                for key in full:
                    if key not in missing:  # full: its slots exist and are all taken
                        _rule_out(key, held_queues, held_tasks, held_keys)
                continue
            if rated:
                granted, waits = bookkeeping.run(lambda c: backend.take_starts(c, rated))
                if not granted:
                    lease.let_go()
                    self._hold(waits, slot)
                    for key in waits:
                        _rule_out(key, held_queues, held_tasks, held_keys)
                    continue
                self.rated_slots.add(slot)
            else:
                self.rated_slots.discard(slot)
            return taken
        return []

    def _fair_round(self, lease: "Lease", bookkeeping: "Bookkeeping", queue: str, slot: int | None) -> ClaimedJob | None:
        """One fair claim of ``queue``: the first available job of the first partition after this
        process's cursor, wrapping round once; a partition short of a slot or a start is stepped over."""
        backend = self.backend
        tasks = sorted(self.app.tasks)
        held_queues, held_tasks, held_keys = self._ruled_out()
        if queue in held_queues:
            return None
        after = self._cursor.get(queue)
        wrapped = after is None
        for _ in range(MAX_TRIES):
            lease.begin()
            try:
                got = backend.claim_flow(lease, None, tasks, self.limits, held_queues, held_tasks, held_keys,
                                         fair_queue=queue, after=after)
            except BaseException:
                lease.rollback()
                raise
            if got is None:
                lease.let_go()
                if wrapped:
                    return None
                after, wrapped = None, True
                continue
            job, keys, partition = got
            missing = [(k.key, k.limit) for k in keys if k.limit is not None and (k.slots_existing or 0) < k.limit]
            full = [k.key for k in keys if k.limit is not None and k.slot is None]
            if missing:
                lease.let_go()
                bookkeeping.run(lambda c: backend.ensure_slots(c, missing))
                continue
            refused: list[str] = full
            if not full:
                rates = [(k.key, k.every) for k in keys if k.every is not None]
                if rates:
                    granted, waits = bookkeeping.run(lambda c: backend.take_starts(c, rates))
                    if not granted:
                        self._hold(waits, slot)
                        refused = list(waits)
            if refused:
                lease.let_go()
                if _queue_refused(queue, refused, held_tasks):
                    return None  # the whole queue is at its limit
                after = partition  # step over this partition
                continue
            self._advance(queue, after, partition)
            return job
        return None

    def _fair_batch(self, lease: "Lease", bookkeeping: "Bookkeeping", queue: str, slot: int | None,
                    limit: int, alone: Callable[[str], bool] | None = None) -> list[ClaimedJob]:
        """A batch from a fair queue without weights: the first available job of each of the next
        ``limit`` partitions after this process's cursor (one round of single fair claims in one
        transaction), wrapping round once; the cursor moves past the last partition returned. A batch
        whose first job must run alone (``alone``) is let go before the cursor moves, and one fair
        claim made instead: the partitions it walked keep their turn."""
        backend = self.backend
        tasks = sorted(self.app.tasks)
        held_queues, held_tasks, held_keys = self._ruled_out()
        if queue in held_queues:
            return []
        after = self._cursor.get(queue)
        wrapped = after is None
        for _ in range(MAX_TRIES):
            lease.begin()
            try:
                got = backend.claim_flow_fair_many(lease, limit, queue, after, tasks, self.limits, held_tasks,
                                                   held_keys)
            except BaseException:
                lease.rollback()
                raise
            if not got:
                lease.let_go()
                if wrapped:
                    return []
                after, wrapped = None, True
                continue
            # the walk's last partition: the rows come in walk order (the index's, i.e. the column's
            # collation -- not Python's string order)
            last = [p for _, _, p in got if p is not None][-1]
            taken, rated, missing, full = _pick(got)
            if missing:
                # created once, on the bookkeeping session (never in a lease); then the batch again from
                # the same place, as the single fair claim does: a partition meeting its first claim is
                # not stepped over for a round (tests/flow/test_flow_fair.py)
                lease.let_go()
                bookkeeping.run(lambda c: backend.ensure_slots(c, list(missing.items())))
                continue
            refused: list[str] = [] if taken else list(full)
            if taken and rated:
                granted, waits = bookkeeping.run(lambda c: backend.take_starts(c, rated))
                if not granted:
                    self._hold(waits, slot)
                    refused, taken = list(waits), []
                else:
                    self.rated_slots.add(slot)
            elif taken:
                self.rated_slots.discard(slot)
            if not taken:
                lease.let_go()
                if _queue_refused(queue, refused, held_tasks):
                    return []  # the whole queue is at its limit
                after = last  # step over these partitions
                continue
            if len(taken) > 1 and alone is not None and alone(taken[0].task):
                lease.let_go()  # its slots too (a rate's job is taken alone: never here)
                job = self._fair_round(lease, bookkeeping, queue, slot)
                return [] if job is None else [job]
            with self._lock:
                self._cursor[queue] = last
                partitions = {job.id: p for job, _, p in got}
                self._fair_batches[slot] = (queue, after, last, [(job.id, partitions[job.id]) for job in taken])
            return taken
        return []

    def batch_ran(self, slot: int | None, started: "set[int] | None") -> None:
        """The slot's last claim ran: ``started`` are the ids of its jobs that ran (empty: none did,
        the batch was let go; None: not known, nothing is moved). A fair batch runs its jobs in
        partition order, so the jobs it did not start (its time budget ran out, the worker is
        stopping, a job that must run alone cut it short) are those of its last partitions: the
        cursor goes back to the last partition that ran, so theirs keep their turn -- unless another
        claim of this process moved the cursor since (then theirs wait one round)."""
        with self._lock:
            batch = self._fair_batches.pop(slot, None)
            if batch is None:
                return
            queue, before, after, jobs = batch
            if started is None:
                return
            ran = [p for job_id, p in jobs if job_id in started]
            if len(ran) == len(jobs) or self._cursor.get(queue) != after:
                return
            self._cursor[queue] = ran[-1] if ran else before

    def _advance(self, queue: str, after: str | None, partition: str | None) -> None:
        """After a fair claim from ``partition`` (found after ``after``): a partition of weight w
        keeps the cursor where it was -- so the next claim finds it again -- until it has had w
        claims in a row (or has nothing left: the next claim then moves on by itself)."""
        weight = self._weights.get(queue, {}).get(partition or "", 1)
        last, n = self._served.get(queue, (None, 0))
        n = n + 1 if last == partition else 1
        if n < weight:
            self._served[queue] = (partition, n)
            self._cursor[queue] = after
        else:
            self._served[queue] = (partition, 0)
            self._cursor[queue] = partition


def _pick(got: list[tuple[ClaimedJob, list[FlowKey], str | None]]
          ) -> tuple[list[ClaimedJob], list[tuple[str, float]], dict[str, int], list[str]]:
    """What a flow claim may run of the jobs it locked: those that got a slot of every limited key,
    in claim order -- a job with a rate only first and alone (the caller takes its starts: ``rated``);
    the others stay locked, untouched, until the transaction ends. Also the keys whose slots do not
    all exist yet (``missing``: key -> limit) and those found full."""
    taken: list[ClaimedJob] = []
    rated: list[tuple[str, float]] = []
    missing: dict[str, int] = {}
    full: list[str] = []
    for job, keys, _ in got:
        for k in keys:
            if k.limit is not None and (k.slots_existing or 0) < k.limit:
                missing[k.key] = k.limit
            elif k.limit is not None and k.slot is None and k.key not in full:
                full.append(k.key)
        if any(k.limit is not None and k.slot is None for k in keys):
            continue
        rates = [(k.key, k.every) for k in keys if k.every is not None]
        if rates:
            if not taken:
                taken, rated = [job], [(key, every) for key, every in rates if every is not None]
            break
        taken.append(job)
    return taken, rated, missing, full


def _queue_refused(queue: str, refused: list[str], held_tasks: list[str]) -> bool:
    """A fair claim's keys found full or held back: True if the queue's own is one (the whole queue
    waits); else an unpartitioned task's leaves this round's next tries (``held_tasks``, on the index
    entry), and a partition's is stepped over by the caller moving past it. The keys are the server's
    jsonb text, compared by value (Python's ``json.dumps`` escapes non-ASCII characters, jsonb does not)."""
    keys = [json.loads(key) for key in refused]
    if ["queue", queue] in keys:
        return True
    for parts in keys:
        if parts[0] == "task" and len(parts) == 2:
            held_tasks.append(parts[1])
    return False


def _rule_out(key: str, held_queues: list[str], held_tasks: list[str], held_keys: list[str]) -> None:
    """Leave ``key``'s jobs out of the rest of this claim round: a whole queue or unpartitioned task
    is left out on the index entry (``held_queues``/``held_tasks``), a partition per row."""
    parts = json.loads(key)
    if len(parts) == 2:
        (held_queues if parts[0] == "queue" else held_tasks).append(parts[1])
    elif key not in held_keys:
        held_keys.append(key)

