"""The worker: ``concurrency`` slots in one process, each a thread with its own lease connection.

Several worker processes cooperate through SKIP LOCKED alone; there is no coordinator.
Shutdown: the first SIGINT/SIGTERM (or :meth:`Worker.stop`) stops claiming and lets in-flight
jobs finish; a second one (or ``stop(abort=True)``) terminates the in-flight jobs' database sessions,
so their transactions roll back and the jobs return to the queue: nothing is lost.
A lost database connection is retried with full-jitter backoff (``skiplock.reconnect``): slots,
listener and maintenance services all wait on the process's readiness probe, so they resume within
about a second of the server's return however long it was away, and the worker logs one WARNING per
outage (and one INFO when it is back), not one per slot and retry.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..values import MAX_QUEUE_CHARS, check_text
from ..errors import ConfigurationError, ConnectionLost, DatabaseError, DatabaseUnavailable
from ..lifecycle import Escalation, Signals
from ..maintenance.periodic import Scheduler
from ..maintenance.pruner import Pruner
from ..maintenance.rescuer import Rescuer
from ..maintenance.service import Service
from ..reconnect import Reconnects, quiet_driver_noise, reporting_losses
from .batching import DEFAULT_BATCH_BUDGET, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_WAIT, BatchPolicy, ClaimSize
from .claiming import Claimer
from .completer import CancelledWhileRunning
from .executor import Executor
from .gate import RunAlone
from .flow import FlowControl
from .queue_view import MOST_NAMED, QueueView
from .gc_freeze import freeze_startup_objects
from .governor import Governor, Permit
from .heartbeat import Heartbeat
from .listener import Listener
from .presence import Presence
from .side_by_side import no_work
from .schema_watch import SCHEMA_CHECK_INTERVAL, SchemaCheck, SchemaWatch, check_interval
from .stats import WorkerStats
from .watchdog import Watchdog

if TYPE_CHECKING:
    from ..app import App
    from ..backend.base import Backend, Lease

log = logging.getLogger("skiplock.worker")

# Connections a starting worker leaves free for everyone else (producers enqueueing, tools).
CONNECTION_HEADROOM = 2
# How long a stopping worker waits for its hooks to be handed the events emitted so far.
HOOKS_DRAIN_SECONDS = 5.0
# A worker whose connection is lost while it starts up (a server restart) keeps trying this long.
STARTUP_RECONNECT_SECONDS = 60.0


class Sleeper(threading.Event):
    """An idle slot's wake-up (``Worker._idle``). ``work``: set by ``Worker.hand`` -- batch-mates for
    the slot to run (side_by_side.py), after which it sleeps on or claims -- or None: woken to claim."""

    work: "Callable[[], None] | None" = None
    then_claim = False  # after ``work``: claim instead of sleeping on (see Worker.hand)


class BatchHand:
    """``Worker.hand`` for one batch (side_by_side.Hand): after its first hand-out, the ``wakes``
    wake-ups it owes (its claim came back full: more jobs may wait), so those go to the slots its jobs
    left idle."""

    __slots__ = ("worker", "pending", "then_claim")

    def __init__(self, worker: "Worker", wakes: int):
        self.worker, self.pending, self.then_claim = worker, wakes, wakes > 0

    def __call__(self, most: int, work_for: "Callable[[int], Callable[[], None]]") -> int:
        n = self.worker.hand(most, work_for, then_claim=self.then_claim)
        if self.pending:
            self.worker.wake(every=False, slots=self.pending)
            self.pending = 0
        return n

    def idle(self) -> bool:
        return self.worker.any_idle()


class Worker:
    """Claims and runs jobs. Create it with :meth:`App.worker`.

    ``batch_size`` is the most jobs one claim takes; ``batch_budget`` the seconds after which a batch
    starts no further job (its remaining jobs are released at its COMMIT); ``batch_slots`` how many
    slots may run batches of near-instant jobs at the same time (other batches, and jobs claimed one
    at a time, run on every slot), and ``flow_batch_slots`` how many may run such batches of
    flow-controlled jobs (turns of their own; None: a share of ``batching.FLOW_TURNS`` per live
    worker process); ``batch_wait`` (seconds, None: off) how long a ready job may wait
    behind its batch-mates while other slots are idle -- a claim then takes no more jobs than start
    within it; ``side_by_side`` (default on) whether a batch of jobs that are not near-instant starts
    them together on idle slots, in its one transaction (:mod:`.side_by_side`), rather than one after
    another. They make the worker's :class:`.batching.BatchPolicy`; pass
    ``batch_policy=`` instead to decide batching otherwise (``batching.WholeBatches``, say). See
    :mod:`.batching` and docs/batches.md.

    A worker claims only jobs of the tasks registered in its app: another app's jobs in the same
    queues (or jobs enqueued by a newer release during a rolling deploy) stay queued, untouched, for a
    worker that knows them; ``skiplock status`` lists queued jobs that no running worker can take
    (each worker advertises its tasks and queues: :mod:`.presence`). ``fail_unknown_tasks=True``
    restores the old behaviour: claim every task and fail, at once, a job whose task is not registered.

    Every ``schema_check_interval`` seconds a running worker checks the database's schema version
    again and logs a WARNING when it no longer matches this skiplock (a migration by a newer
    release; ``schema.problem``): :mod:`.schema_watch`.

    ``freeze_gc=True``: once started, the objects alive then are frozen out of Python's garbage
    collector's walks, which otherwise pause every slot for tens of milliseconds (:mod:`.gc_freeze`;
    ``skiplock worker`` does it unless ``--no-freeze-gc``).
    """

    def __init__(self, app: "App", queues: Sequence[str] | None = None, concurrency: int = 4, *,
                 poll_interval: float = 0.5, name: str | None = None, handle_signals: bool = True,
                 max_reconnect_delay: float = 30.0, maintenance: bool = True, prune_interval: float = 60.0,
                 batch_size: int = DEFAULT_BATCH_SIZE, batch_budget: float = DEFAULT_BATCH_BUDGET, batch_slots: int = 1,
                 batch_wait: float | None = DEFAULT_BATCH_WAIT, listen: bool = True,
                 rescue_interval: float = 5.0, fail_unknown_tasks: bool = False, adaptive_limit: bool = True,
                 batch_policy: BatchPolicy | None = None, metrics_interval: float = 15.0,
                 flow_batch_slots: int | None = None, schema_check_interval: float = SCHEMA_CHECK_INTERVAL,
                 side_by_side: bool = True, freeze_gc: bool = False):
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        if queues is not None:
            if isinstance(queues, str):
                queues = [queues]
            queues = list(queues)
            if not queues:
                raise ValueError(f"queues must be a list of non-empty names, got {queues!r}")
            for i, q in enumerate(queues):  # the same check as enqueue's: a name no job can have is a mistake
                check_text(f"queues[{i}]", q, MAX_QUEUE_CHARS, error=ValueError)
        self.app = app
        self.queues = queues
        self.concurrency = concurrency
        self.freeze_gc = bool(freeze_gc)
        self.poll_interval = poll_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.handle_signals = handle_signals
        self.max_reconnect_delay = max_reconnect_delay
        self.recovery: Reconnects | None = None  # set by run(): shared by the slots, listener and services
        self.batching = batch_policy if batch_policy is not None else BatchPolicy(
            batch_size, batch_budget, batch_slots, batch_wait=batch_wait, flow_batch_slots=flow_batch_slots,
            side_by_side=side_by_side)
        self.batch_budget = self.batching.batch_budget
        self.rescue_interval = rescue_interval
        self.schema_check_interval = check_interval(schema_check_interval)
        # what the schema watch found (worker/schema_watch.py): set by run()
        self.schema: SchemaCheck | None = None
        self.metrics_interval = metrics_interval  # seconds between samples of the queue gauges (metrics on)
        self.fail_unknown_tasks = bool(fail_unknown_tasks)
        self.flow: FlowControl | None = None  # set by run(): the flow claim (worker/flow.py)
        self.listen = listen
        self.listener: Listener | None = None
        self._wake_up = threading.Lock()  # guards _wakes, _unserved, _sleepers and _found_all_at
        self._wakes = 0  # wake-ups of every slot so far: a slot that was busy when one came does not then sleep
        # a wake-up of single slots found none sleeping, and no claim has begun since: the next slot
        # that would go to sleep claims instead (see wake())
        self._unserved = False
        self._claims = itertools.count(1)  # numbers the claims in the order they begin
        self._found_all_at = 0  # the number of the latest-begun claim that found every available job
        # Slots waiting in _idle and not yet woken, each by its own event, the most recently idle last:
        # wake-ups take them from the end (see wake()).
        self._sleepers: list[Sleeper] = []
        # slots the governor holds back (no permit free): a batch's hand-off reaches them first, a
        # wake-up never (they cannot claim), a permit given back or a grown limit does (_park)
        self._parked: list[Sleeper] = []
        self._helping = 0  # parked slots running batch-mates handed to them now (see _handable)
        self._lent = 0  # sleeping slots running batch-mates handed to them now (they sleep again after)
        self._ticking = False  # one parked slot wakes every governor window (_park)
        self._none_left = False  # (run(stop_when_empty=True)) a claim found no job available
        self.maintenance = maintenance
        self.prune_interval = prune_interval
        self.services: list[Service] = []
        self.stats = WorkerStats()
        self.started = threading.Event()
        self._stopping = threading.Event()
        self._leases: dict[int, "Lease"] = {}
        self._busy: set[int] = set()
        self._signals = Escalation(self._graceful, lambda name: self.stop(abort=True))
        self.governor = Governor(concurrency, adaptive=bool(adaptive_limit))
        self.governor.on_free = self._permits_free
        self.claimer = Claimer(self)  # claiming.py: which claim, how many jobs
        # a worker of every queue: the queues its claims name while one is paused (queue_view.py; set by run())
        self.queue_view: QueueView | None = None

    # ---- control -------------------------------------------------------------------------------

    def wake(self, every: bool = True, slots: int = 1) -> None:
        """Wake idle slots to claim now: every one, or (a NOTIFY) ``slots`` of them; a slot whose claim
        came back full wakes two more (``_slot``), so a burst of n jobs reaches n slots in about
        log2(n) claim round trips, not n one after another, while a single job does not send every
        idle slot to the database for nothing. A wake-up that finds fewer slots sleeping than it
        asks for is *unserved* (``_unserved``) until a claim begins -- that claim's snapshot is taken
        after the wake-up, so it sees the job that sent it --, and the next slot that would go to
        sleep meanwhile claims instead (``_idle``): none is lost. (It used to send every slot busy
        meanwhile claiming again, and all but one of those claims found nothing: with 1 ms jobs
        offered at half the capacity, a sixth of all claims; docs/benchmarks.md, "Session 22".) A
        wake-up of every slot (``every``) still makes every slot claim again before it sleeps -- but
        the slots the governor holds back (``_park``) it wakes only to stop: woken to claim, they
        took the permits the idle slots had given back, each opening a session of its own.

        Last in, first out: the slots that went idle most recently are woken first, so a light load
        is served by the same few slots and sessions, whose prepared statements keep their plans,
        while the rest sleep. Woken in turn (first in, first out, as a condition variable does), a
        light load went round every slot's session, and each of them planned the claim, the attempt
        and the finishing write again after every plan invalidation (an autovacuum of the jobs
        table invalidates them): measured, 2 processes x 32 slots at 150 jobs/s planned `complete`
        at more than half of its runs."""
        with self._wake_up:
            sleepers = self._sleepers
            if every:
                self._wakes += 1
                woken, self._sleepers = sleepers, []
                if self._stopping.is_set():  # parked slots too; else they could not claim (see _park)
                    woken, self._parked = woken + self._parked, []
            else:
                cut = max(0, len(sleepers) - slots)
                woken, self._sleepers = sleepers[cut:], sleepers[:cut]
                if len(woken) < slots:
                    self._unserved = True
            for event in woken:  # under the lock: a slot whose wait timed out sees it set or listed
                event.set()

    def hand(self, most: int, work_for: "Callable[[int], Callable[[], None]]", then_claim: bool = False) -> int:
        """Hand ``work_for(0)``, ``work_for(1)``, ... (a batch's jobs, side_by_side.py) to up to
        ``most`` idle slots, one each: the slots the governor holds back first (``_park``), then the
        longest idle (the last one is the polling slot, see ``_idle``); returns how many were
        handed. A slot runs what it is handed and goes back to sleep -- or, ``then_claim`` (the
        batch's claim came back full: more jobs may wait), claims, as a slot woken by a full claim
        does -- unless a wake-up it must not sleep through came meanwhile (a held-back slot tries
        for a permit again); while it runs it, it is not idle: no wake-up and no other hand-off
        reaches it."""
        if most <= 0 or not self.any_idle():  # (a hint read without the lock: none idle)
            return 0
        with self._wake_up:
            # the slots the governor holds back first (as many as it cut): they could not claim anyway
            parked = min(most, self._handable())
            taken, self._parked = self._parked[:parked], self._parked[parked:]
            self._helping += parked
            n = min(most - parked, len(self._sleepers))
            taken, self._sleepers = taken + self._sleepers[:n], self._sleepers[n:]
            self._lent += n
            n = len(taken)
            for k, sleeper in enumerate(taken):  # under the lock, as wake(): see _idle
                sleeper.work, sleeper.then_claim = work_for(k), then_claim
                sleeper.set()
        return n

    def any_idle(self) -> bool:
        """Some slot could be handed a batch's jobs now: one sleeps for want of work, or a parked one
        may be handed them (``_handable``). A hint read without the lock, as ``hand``'s first test."""
        return bool(self._sleepers) or (bool(self._parked) and self._handable() > 0)

    @property
    def _sleeping(self) -> int:
        """Slots waiting in ``_idle`` and not yet woken, and those of ``_park`` a batch may be handed to
        now (``_handable``)."""
        return len(self._sleepers) + self._handable()

    def _handable(self) -> int:
        """How many parked slots a batch may be handed now: no more than the governor's last cuts took
        away (its ``cap`` less its ``limit``), less those running batch-mates already. So a cut costs
        no handler room, while a worker of many slots -- whose limit sits at its share, with the
        others parked -- runs no more handlers at once than before: 1 x 256 slots handing batches of
        1 ms jobs to every parked slot drained at a third of 1 x 64 (docs/benchmarks.md, "Session
        28"). (Read without the lock it is a hint, as ``_sleeping`` is.)"""
        governor = self.governor
        return max(0, min(len(self._parked), governor.cap - governor.limit - self._helping))

    def _park(self) -> None:
        """Wait while the governor holds this slot back (it found every permit taken), as an idle
        slot: a batch's jobs may be handed to it meanwhile (``hand``; they run in their claim's
        transaction, under that claim's lease, so they need no permit). Returns -- to try for a
        permit again -- once it ran what it was handed, when ``Governor.on_free`` announces a permit
        (``_permits_free``), on a wake-up of every slot (stopping, say), or after a while: one parked
        slot (the ticker) every governor window, so the limit moves even when no lease ends, the
        others every second -- but not while a slot sleeps for want of work (``_idle``), or runs
        batch-mates handed to it there: the permits free then are for the slots that gave them back,
        whose sessions are open. (A parked slot that took one opened a session of its own, its
        statements planned again, to claim what a warm slot would have: 1 x 64 slots draining 1 ms
        jobs opened 17-26 sessions within the drain's 1.7 s, at 0.89 x the throughput of 1 x 16 over
        eight alternating pairs.) (With Python threads every wake-up takes the GIL from a running
        handler: dozens of parked slots polling at once cost the busy ones measurably.)"""
        event = Sleeper()
        with self._wake_up:
            if self._stopping.is_set():
                return
            self._parked.append(event)
            ticker = not self._ticking
            self._ticking = self._ticking or ticker
        try:
            governor = self.governor
            while True:
                # A permit given back between try_acquire and the append above found no slot parked:
                # look again now that this one is (on_free runs after the count went down) -- unless
                # a slot sleeps for want of work: a free permit is that slot's (see _idle).
                if governor.held >= governor.limit or self._sleepers or self._lent:
                    event.wait(governor.window if ticker else 1.0)
                with self._wake_up:
                    if event.is_set():
                        break
                    if not (self._sleepers or self._lent) or self._stopping.is_set():  # not woken: off the list
                        self._parked.remove(event)
                        return
                if ticker:  # the limit still moves (it grows only while a slot asks for a permit)
                    governor.tick()
            work, event.work = event.work, None
            if work is not None:
                try:
                    work()  # batch-mates handed to this slot (side_by_side.py)
                finally:
                    with self._wake_up:
                        self._helping -= 1
        finally:
            if ticker:
                with self._wake_up:
                    self._ticking = False

    def _found_none_left(self) -> None:
        """(``run(stop_when_empty=True)``) A claim found no job available: the parked slots that never
        claimed stop too, instead of each opening a session for a claim of its own. (A slot that did
        claim owes one more: jobs its batch released at the COMMIT are claimable again.)"""
        with self._wake_up:
            self._none_left = True
            woken, self._parked = self._parked, []
            for event in woken:
                event.set()

    def _permits_free(self, n: int) -> None:
        """``Governor.on_free``: ``n`` more permits may be taken: that many parked slots try again."""
        with self._wake_up:
            woken, self._parked = self._parked[:n], self._parked[n:]
            for event in woken:
                event.set()

    def _idle(self, since: int, timeout: float | None = None, permit: Permit | None = None) -> Permit | None:
        """Wait for a wake-up or ``poll_interval`` -- unless a wake-up of every slot came since
        ``since`` (the count when this slot began its last claim), or a wake-up is unserved (see
        wake()): this slot claims at once instead of sleeping through it (a NOTIFY that arrived while
        every slot was busy found nobody waiting for it, and its job may have committed after their
        claims' snapshots). A wake-up some sleeping slot took is that slot's to serve, and an
        unserved one the next claim's: the others need not claim for it.

        While NOTIFYs reach the process (its listener is up), one sleeping slot polls: the one that
        went idle last (its session is the warmest). The others sleep on until woken, or until they
        are that slot, or until ``timeout`` (a rate-held flow key's next start): polling only
        finds what no NOTIFY announces (a job whose ``run_at`` came, one a rolled-back lease
        returned), and a poll that finds a full claim wakes more slots. Without a listener every
        slot polls: polling is all it has. Idle, 2 processes x 32 slots used to claim 129 times a
        second for nothing.

        ``permit``: the governor's permit the slot holds. Returned when the slot claims at once (it
        keeps it); else given back, unannounced, once the slot is on the sleepers' list: a parked
        slot leaves it to the sleepers (``_park``), so the sessions already open take the next work,
        and no permit is free while no slot sleeps for want of work."""
        event = Sleeper()
        if not self._sleep(event, since, permit):
            return permit
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.poll_interval if deadline is None else min(self.poll_interval, deadline - time.monotonic())
            if not event.wait(max(0.0, wait)):
                with self._wake_up:
                    if not event.is_set():
                        if (self._stopping.is_set() or (deadline is not None and time.monotonic() >= deadline)
                                or not self._listening() or self._sleepers[-1] is event):
                            self._sleepers.remove(event)
                            return None
                        continue
            # woken: wake() or hand() took it off the list
            work, event.work = event.work, None
            if work is None:
                return None
            event.clear()
            try:
                work()  # a batch-mate handed to this idle slot (side_by_side.py): then back to sleep
            finally:
                with self._wake_up:
                    self._lent -= 1
            if event.then_claim or not self._sleep(event, since):
                return None

    def _sleep(self, event: "Sleeper", since: int, permit: Permit | None = None) -> bool:
        """Put this slot on the sleepers' list (see ``_idle``), and give ``permit`` back (unannounced:
        under the lock, so a parked slot never sees it free with no sleeper to take it); False: it
        claims at once instead, keeping ``permit``."""
        with self._wake_up:
            if self._stopping.is_set() or self._wakes != since:
                return False
            if self._unserved:
                self._unserved = False  # this slot's claim serves it (see _claim_begins)
                return False
            self._sleepers.append(event)
            if permit is not None:
                self.governor.release(permit, announce=False)
            return True

    def _claim_begins(self) -> int:
        """A slot is about to claim: its number (claims are numbered in the order they begin). The
        claim serves an unserved wake-up (see wake()): its snapshot is taken after it."""
        if self._unserved:
            with self._wake_up:
                self._unserved = False
        return next(self._claims)

    def _found_all(self, number: int) -> None:
        """Claim ``number`` found every job available to this worker (it came back short)."""
        with self._wake_up:
            self._found_all_at = max(self._found_all_at, number)

    def _drained(self, number: int, wakes: int, claimed: int, limit: int) -> bool:
        """After claim ``number`` (begun at wake-up count ``wakes``) took ``claimed`` of ``limit`` jobs
        and ran them all: nothing is left to claim but what a wake-up will announce, so the slot
        sleeps until one (``_idle``, which returns at once for a wake-up it must not sleep through)
        instead of claiming again. True when the claim came back short, or when a claim that began
        after it found every available job -- the slot whose claim came back full used to claim again
        after its batch, and with the rest of a burst taken by the slots it woke, that claim found
        nothing: with 1 ms jobs offered at half the capacity, a quarter of all claims (docs/benchmarks.md,
        "Session 22"). Jobs no NOTIFY announces (a ``run_at`` that came, a lease that rolled back) are
        the polling slot's (``_idle``). Only while NOTIFYs reach the process: without a listener a slot
        claims again, polling is all it has."""
        if not self._listening():
            return False
        if claimed < limit and self._wakes == wakes:
            return True
        return self._found_all_at > number

    def _listening(self) -> bool:
        """NOTIFYs reach this worker now (its listener's session is up)."""
        listener = self.listener
        return listener is not None and listener.listening.is_set()

    @property
    def idle_slots(self) -> int:
        """Slots that could take a share of a claim now: sleeping for want of work, with a permit
        free for them (a slot the governor keeps waiting cannot claim; a hint, read without a lock)."""
        governor = self.governor
        return max(0, min(self._sleeping, governor.limit - governor.held))

    def stop(self, abort: bool = False) -> None:
        """Stop claiming. With ``abort``, also end in-flight jobs: their transactions roll back."""
        self._stopping.set()
        self.wake()
        if abort and not self.stats.aborted:
            self.stats.aborted = True
            pids = [lease.session_id for i, lease in list(self._leases.items()) if i in self._busy and lease.alive()]
            log.warning("aborting %d in-flight job(s); their transactions roll back and the jobs stay queued", len(pids))
            try:
                self.app.backend.terminate(pids)
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("could not terminate in-flight sessions (%s); they end when this process exits", exc)

    def _graceful(self, name: str) -> None:
        log.warning("received %s: finishing in-flight jobs, claiming no more (signal again to abort them)", name)
        self.stop()

    @property
    def signals_received(self) -> int:
        """SIGINT/SIGTERM this worker handled (its first stops it gracefully, a second aborts)."""
        return self._signals.received

    # ---- running -------------------------------------------------------------------------------

    @property
    def _claim_tasks(self) -> list[str] | None:
        """The tasks the plain claim takes (None: every one): those without flow limits now (task
        limits can change at runtime: worker/flow.py re-reads them)."""
        if self.fail_unknown_tasks or self.flow is None:
            return None
        return self.flow.unlimited_tasks

    def run(self, stop_when_empty: bool = False) -> WorkerStats:
        """Run until stopped (or, with ``stop_when_empty``, until no job is available)."""
        quiet_driver_noise()
        self.recovery = Reconnects(self.app.backend.dsn, log, cap=self.max_reconnect_delay)
        self._starting(self.app._ready)  # clear error now if the database or schema is not usable
        self._starting(self._check_connection_budget)
        self._stop_when_empty = stop_when_empty
        # Flow-controlled tasks (limits in code) are claimed by the flow claim only (worker/flow.py).
        self.flow = FlowControl(self.app, self.queues, self.fail_unknown_tasks)
        backend = self.app.backend
        if self.queues is None and backend.capabilities.claimable_queues:
            self.queue_view = QueueView(MOST_NAMED)
        presence = Presence(self.app.backend, self.name, list(self.app.tasks), self.queues, concurrency=self.concurrency,
                            on_live=self._live_processes)
        self.services.append(presence)
        self.schema = SchemaCheck(self.app.backend, self.name)
        self.services.append(SchemaWatch(self.schema, self.schema_check_interval))
        claimed_leases = [t.lease_seconds for t in self.app.tasks.values() if t.lease == "claimed"]
        heartbeat = Heartbeat(self.app.backend, min(claimed_leases) / 3) if claimed_leases else None
        capabilities = self.app.backend.capabilities
        # A backend whose server does not bound leases: the worker's watchdog does (watchdog.py).
        watchdog = None if capabilities.server_bounds_lease else Watchdog()
        executor = Executor(self.app, self.name, heartbeat, self.batching, slots=self.concurrency, watchdog=watchdog)
        signals = Signals.install(self._signals, self.handle_signals)  # the main thread's only
        if heartbeat is not None:
            self.services.append(heartbeat)
        if watchdog is not None:
            self.services.append(watchdog)
        metrics = self.app.metrics
        if metrics is not None:  # skiplock.observability.metrics: this worker's counters, the sampled gauges
            metrics.attach(self)
            from ..observability.metrics import Sampler

            self.services.append(Sampler(metrics, self.metrics_interval))
        if self.maintenance:
            self.services.append(Rescuer(self.app, self.rescue_interval))
            if self.app.schedules:
                self.services.append(Scheduler(self.app))
            self.services.append(Pruner(self.app, self.prune_interval))
        for service in self.services:
            service.recovery = self.recovery
        threads = [threading.Thread(target=self._slot, args=(i, executor), name=f"skiplock-slot-{i}", daemon=True)
                   for i in range(self.concurrency)]
        if self.listen and capabilities.listen_notify:  # else: poll only
            backend = self.app.backend
            self.listener = Listener(backend.connect_listener, backend.wake_payload, self.wake, self._stopping,
                                     self.max_reconnect_delay, recovery=self.recovery)
        try:
            # advertised before the first claim; deleted when the services stop
            self._starting(presence.step)
            if self.listener is not None:
                self.listener.start()
            for service in self.services:
                service.start()
            if self.freeze_gc:  # what lives as long as the process exists now (gc_freeze.py); no slot runs yet
                freeze_startup_objects()
            for t in threads:
                t.start()
            self.started.set()
            aborted_at: float | None = None
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.1)
                if self.stats.aborted:
                    aborted_at = aborted_at or time.monotonic()
                    if time.monotonic() - aborted_at > 2.0:
                        log.warning("in-flight handlers did not return after abort; leaving them (their sessions are gone)")
                        break
        finally:
            self._stopping.set()
            if self.listener is not None:
                self.listener.stop()
            for service in self.services:
                service.stop()
            executor.close()
            if metrics is not None:
                metrics.detach(self)
            if self.app.hooks.active and not self.app.hooks.drain(HOOKS_DRAIN_SECONDS):
                log.warning("hooks still running after %gs at exit; not waiting for them", HOOKS_DRAIN_SECONDS)
            log.debug("lease limit %d of %d slots at exit (moved %d times)", self.governor.limit,
                      self.concurrency, self.governor.changes)
            signals.restore()
        return self.stats

    def _starting(self, step: Callable[[], Any]) -> Any:
        """A start-up step that talks to the database. A connection lost under it -- the server was
        there a moment ago: a restart while this worker starts -- is retried as the running worker
        retries (the same backoff, one WARNING, the readiness probe) for up to
        ``STARTUP_RECONNECT_SECONDS``; a database that cannot be reached at the first try still
        fails at once (a wrong DSN, a server not started: a clear error, not a silent wait)."""
        recovery = self.recovery
        assert recovery is not None  # set first thing in run()
        backoff = recovery.backoff()
        lost_at: float | None = None
        who = f"worker {self.name} (start-up)"
        while True:
            try:
                with reporting_losses():  # the driver's lines about it: this reports it
                    result = step()
            except DatabaseUnavailable as exc:
                if lost_at is None and not isinstance(exc, ConnectionLost):
                    raise
                now = time.monotonic()
                lost_at = now if lost_at is None else lost_at
                if now - lost_at > STARTUP_RECONNECT_SECONDS or self._stopping.is_set():
                    raise
                recovery.lost(who, exc, backoff.next(), self._stopping)
                continue
            recovery.connected(who, backoff)
            return result

    def _live_processes(self, processes: int) -> None:
        """The presence loop's count of live worker processes: their shares of permits and turns."""
        self.governor.share(processes)
        self.batching.live_processes(processes)

    def _check_connection_budget(self) -> None:
        """Refuse to start (ConfigurationError naming the numbers) a worker that would take more
        connections than the server lets this role open on this database, less
        ``CONNECTION_HEADROOM`` left for producers -- instead of taking every connection, retrying
        for ever and leaving producers with "too many clients". Checked once, at start-up.

        A worker opens, besides the App's pooled connection already open: per slot a lease
        connection and an attempt-counting one, the LISTEN connection, and one more pooled
        connection for maintenance and heartbeats."""
        per_slot, fixed = 2, (1 if self.listen else 0) + 1
        need = self.concurrency * per_slot + fixed
        available, why = self.app.backend.connection_budget().available()
        if need + CONNECTION_HEADROOM <= available:
            return
        fits = (available - CONNECTION_HEADROOM - fixed) // per_slot
        advice = f"lower concurrency (--concurrency) to {fits} or raise the limit" if fits >= 1 else "raise the limit"
        raise ConfigurationError(
            f"not enough database connections for {self.concurrency} slot(s): the worker needs {need} "
            f"({self.concurrency} x {per_slot} per slot: lease + attempt counting, + {fixed} for the listener and "
            f"maintenance) and leaves {CONNECTION_HEADROOM} free for producers, but only {available} can be opened "
            f"({why}); {advice}")

    def _claim_size(self) -> ClaimSize:
        size = self.batching.claim_size()
        if not self.app.backend.capabilities.batched_claims:  # every claim takes one job
            size.maximum = size.value = 1
        return size

    def _slot(self, index: int, executor: Executor) -> None:
        slot_name = f"{self.name}/{index}"
        backend: "Backend" = self.app.backend
        early_turns = backend.capabilities.claim_while_committing  # a batch's turn goes back before its COMMIT
        lease: "Lease | None" = None
        recovery = self.recovery
        assert recovery is not None
        backoff = recovery.backoff()
        permit: Permit | None = None  # the governor's permit this slot holds, if any
        claimed_once = False
        gate = executor.gate
        alone = False  # the next claim holds the gate alone: a suspect is waiting for it (gate.py)
        try:
            while not self._stopping.is_set():
                try:
                    if lease is not None and not lease.alive():  # a timed-out job's, or found gone
                        lease.close()
                        lease = None
                    # The permit first, the connection second: a slot the governor keeps waiting opens
                    # no session, so extra slots cost neither connections nor the server's CPU.
                    if permit is None:
                        permit = self.governor.try_acquire()
                        if permit is None:  # held back: wait where a batch can still hand it jobs
                            self._park()
                            if self._stop_when_empty and self._none_left and not claimed_once:
                                return  # (it never claimed: it owes no claim for jobs a COMMIT released)
                            continue
                    claimed_once = True
                    keep = drained = ran_all = idle = False  # keep the permit for the next claim; see `drained` below
                    try:
                        size = permit.state
                        if size is None:  # the claim size travels with the permit, not the slot
                            size = permit.state = self._claim_size()
                        if lease is None:
                            lease = backend.connect_lease(f"skiplock-worker {slot_name}")
                            self._leases[index] = lease
                        began = time.perf_counter()
                        wakes, number = self._wakes, self._claim_begins()
                        if not alone:
                            gate.wait_open(self._stopping)  # no claim while a suspect runs alone, or waits to
                            if self._stopping.is_set():
                                continue
                        # The gate is held from the claim to the COMMIT, never waited for in a transaction.
                        with gate.exclusive() if alone else gate.shared():
                            alone = False
                            if self._stopping.is_set():  # stopped while it waited for the gate: claim nothing
                                continue
                            claimed, turn = self.claimer.claim(lease, size, executor, index)
                            limit = self.claimer.limits.get(index, size.value)  # what this claim could take
                            held = [turn]  # the batch turn, until given back (before the COMMIT, or below)

                            def let_turn_go() -> None:
                                # The batch has run: its COMMIT (a WAL flush) need not hold the turn, so
                                # the next slot's claim overlaps it, stepping over this batch's rows
                                # until it commits (docs/batches.md, "Turns").
                                if held[0]:
                                    held[0] = False
                                    self.batching.give_turn(index)
                            if backoff.failures:  # the connection works: an outage (if any) is over
                                recovery.connected(f"slot {slot_name}")
                            try:
                                if not claimed:  # nothing written, nothing locked (a flow claim let its own go)
                                    lease.let_go()
                                else:
                                    more = 0
                                    if len(claimed) >= size.value:
                                        more = 2  # there may be more: let idle slots look
                                    elif len(claimed) >= limit:
                                        more = 1  # a share (BatchPolicy.share) came back full: one more slot looks
                                    hand = None
                                    if self.claimer.side.get(index):  # side by side: idle slots are
                                        hand = BatchHand(self, more)  # its jobs' first, then wake-ups
                                    elif more:
                                        self.wake(every=False, slots=more)
                                    self._busy.add(index)
                                    started: set[int] | None = None  # which jobs ran, for a fair batch's cursor
                                    ran_all = False  # every job claimed ran (none released at the COMMIT)
                                    try:
                                        early = turn and early_turns  # see Capabilities.claim_while_committing
                                        run = executor.run_batch(lease, claimed, slot_name, self.batch_budget,
                                                                 self._stopping, let_turn_go if early else None,
                                                                 hand=hand)
                                        started = None if run.jobs is None else {c.id for c in run.jobs}
                                        ran_all = not run.out_of_time and len(run.outcomes) == len(claimed)
                                        for outcome in run.outcomes:
                                            self.stats.count(outcome)
                                        size.after(len(claimed), run)
                                        if run.outcomes:
                                            jobs = len(run.outcomes)
                                            handler = run.handler_seconds / jobs
                                            self.governor.observe(
                                                (time.perf_counter() - began - run.handler_seconds) / jobs,
                                                batched=not executor.alone(claimed[0].task), handler=handler)
                                    except RunAlone:  # its transaction let go: claim again, holding the gate alone
                                        alone, started = True, set()
                                    finally:
                                        self._busy.discard(index)
                                        if hand is not None:  # the wake-ups it owes, if it never handed out
                                            hand(0, no_work)
                                        if self.flow is not None:
                                            self.flow.batch_ran(index, started)
                                    if claimed[0].slots and not self._stopping.is_set():
                                        self.wake(every=False, slots=1)  # its slots are free: an idle slot may look
                            finally:
                                let_turn_go()
                        # A claim that came back short found every available job; unless a wake-up
                        # came since it began, nothing was enqueued since (NOTIFY is sent at commit),
                        # so this slot waits for one instead of a claim that would find nothing
                        # (with no listener it claims again: polling is all it has).
                        # (A batch that released jobs at its COMMIT -- out of time, stopping, a suspect
                        # let go -- sent no NOTIFY for them: it claims again.)
                        if self.claimer.found_all.get(index):
                            self._found_all(number)
                        drained = bool(claimed) and ran_all and self._drained(number, wakes, len(claimed), limit)
                        keep = bool(claimed) and not drained
                        idle = not keep  # no more work: it gives the permit back as it sleeps (_idle)
                    finally:
                        # A slot that keeps finding work keeps its permit from one lease to the next, so
                        # the same few slots (and sessions) stay busy while the rest sleep, instead of the
                        # permit passing round every slot; it gives it back when it goes idle (once it
                        # sleeps, see _idle), on an error, or when the limit has fallen below the
                        # permits held.
                        if not (keep or idle) or self._stopping.is_set() or self.governor.over():
                            self.governor.release(permit)
                            permit = None
                    backoff.reset()
                    if drained:
                        flow = self.flow
                        permit = self._idle(wakes, flow.next_due(index) if flow is not None else None, permit)
                    elif not claimed:
                        flow = self.flow
                        if self._stop_when_empty and not (flow is not None and flow.holding()):
                            self._found_none_left()
                            return  # (a job held back by its rate is not "none available")
                        due = flow.next_due(index) if flow is not None else None
                        permit = self._idle(wakes, due, permit)
                except CancelledWhileRunning as cancelled:  # logged by the reporter; a new session, no outage
                    self.stats.count(cancelled.outcome)
                    if lease is not None:
                        lease.close()
                        lease = None
                except Exception as exc:  # noqa: BLE001 - a slot never dies; it reconnects with backoff
                    if self.stats.aborted:
                        return
                    self.stats.reconnects += 1
                    if lease is not None:
                        lease.close()
                        lease = None
                    delay = backoff.next()
                    if isinstance(exc, DatabaseUnavailable):  # ConnectionLost too
                        recovery.lost(f"slot {slot_name}", exc, delay, self._stopping)
                        continue
                    if isinstance(exc, DatabaseError):  # the session is alive: a database error, not a lost link
                        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        log.warning("slot %s: database error %s (%s: %s); starting over in %.2fs", slot_name,
                                    getattr(exc, "sqlstate", None), type(exc).__name__, reason, delay)
                    else:
                        log.exception("slot %s: unexpected error; reconnecting in %.2fs", slot_name, delay)
                    self._stopping.wait(delay)
        finally:
            if permit is not None:
                self.governor.release(permit)
            if lease is not None:
                lease.close()
            self._leases.pop(index, None)
