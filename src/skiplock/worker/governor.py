"""How many of a worker's slots hold a lease at once: adapted to what the database can take.

Why a limit at all. Under the transaction lease a job's row stays locked in the queue index while its
handler runs, so every claim -- from this process and from every other worker -- steps over the rows
held by all running leases (and over the index entries of jobs finished too recently for the server
to drop them). A claim's cost therefore grows with the number of leases in flight, and past the point
where the database (or the machine's cores) is saturated, more slots make every claim slower and the
worker as a whole slower: measured on 2 cores with 1 ms jobs, the median claim took 1.6 ms with 4
slots, 6 ms with 16, 19 ms with 64 and 143 ms with 256, and throughput fell from 4,300 to 370 jobs/s
(docs/benchmarks.md, "Slot and process sweep").

What it does. A slot takes a *permit* before it claims. It keeps it from one lease to the next while
its claims find work, and gives it back when a claim finds nothing (as it goes to sleep, unannounced:
the next wake-up's slot takes it, and a slot held back leaves it to those), on an error, or when
``over()`` (the limit fell below the permits held); so the same few slots stay busy and the rest
sleep (the worker opens a slot's session only once it holds a permit: the slots held back never do). A permit carries ``state`` (the worker's
claim size) to whichever slot takes it next. The number of permits adapts, in the manner of TCP Vegas,
to the lease overhead per job: it starts at ``start`` and, while slots are waiting for a permit, grows
each window in which leases are about as cheap as in the cheapest recent windows (the *baseline*: the
lowest window median of the last ``history`` windows); when a window's median takes more than
``tolerance`` times the baseline (and at least ``slack`` seconds more), and the whole lease per job
-- handler time included -- takes more than ``tolerance`` times what it would at the baseline, the
limit shrinks in proportion to that whole, never below ``floor``. (A lease's throughput is its jobs
over its whole time: for 10 ms jobs an overhead that doubles from 2 to 4 ms costs 17 %, not half.
Judged on the overhead alone, the few milliseconds a virtual machine's scheduling adds at random
halved the limit for such jobs again and again, without the overhead falling: 1 process x 16 slots
drained 10 ms jobs in batches at 640-920 jobs/s, against 1,090 with every slot.) A window with
fewer than ``min_samples`` leases gives no evidence of contention: the limit then doubles if slots
are waiting -- so long-running jobs, whose claims are rare and cheap, get every slot. Processes sharing a database also split ``start`` between them while
their leases run batches (``share()``, fed by the presence loop's count of live workers): one more
lease in one process barely moves its own overhead, so each adapting alone let them all collapse.

A slot without a permit is not lost to the worker. It waits as an idle slot does (``Worker._park``),
so a batch may hand it batch-mates to run side by side (side_by_side.py): they run in their claim's
transaction, under the lease that claim already holds, so they add no lease and need no permit --
as many such slots at once as the last cuts took away (``cap`` less ``limit``), so a cut costs no
handler room while a worker at its share runs no more handlers than its leases. (Such slots used to
wait in the governor, out of reach: when the limit fell after a brief slowdown of the server, most
slots ended up waiting there, the remaining leases ran their batches one job after another, and at
2,600 jobs/s of 1 ms jobs the backlog grew into pickups of 0.4-3 s; docs/benchmarks.md, "Session
28".) ``on_free`` tells the worker when a permit may be taken again.

Seeing it: every move of the limit is logged at DEBUG on ``skiplock.worker.governor``, with its
reason and the overheads it judged (a stall in pickups that coincides with a cut reads straight off the
log); with metrics on, ``skiplock_worker_lease_limit`` and ``skiplock_worker_leases_held`` are the
limit and the permits held now, ``skiplock_worker_lease_limit_changes_total`` how often it moved.

Guarantees: it never changes what runs or in which lease, only when a slot may claim; a slot
waiting for a permit holds no transaction and no row lock of its own; at most ``limit`` permits are
held once their holders have seen ``over()`` after their current lease; every permit given back
while fewer than ``limit`` are held (but one whose holder goes idle), and every growth of the limit,
is announced to ``on_free``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from statistics import median
from typing import Any, Callable

log = logging.getLogger("skiplock.worker.governor")


class Permit:
    """One of the governor's permits. ``state`` is what its holders keep with it from one lease to
    the next -- the worker keeps the claim size there, so a permit handed to another slot arrives
    with the batch size its last holder reached instead of starting again at one job."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: Any = None


class Governor:
    def __init__(self, slots: int, *, start: int = 16, floor: int = 4, tolerance: float = 1.3,
                 slack: float = 0.002, window: float = 0.25, min_samples: int = 8, history: int = 40,
                 adaptive: bool = True, clock: Callable[[], float] = time.monotonic):
        self.slots = slots
        self.adaptive = adaptive
        self.start = start
        self.floor = min(slots, floor)
        self.limit = slots if not adaptive else max(self.floor, min(slots, start))
        self.cap = self.limit  # the most permits while batching (share())
        self.tolerance = tolerance
        self.slack = slack
        self.window = window
        self.min_samples = min_samples
        self._clock = clock
        self._lock = threading.Lock()
        self._held = 0
        # called (outside the lock) with how many more permits may be taken now: one given back, or the
        # limit grown -- the worker wakes that many of the slots waiting for one (see try_acquire)
        self.on_free: Callable[[int], None] | None = None
        self._free: list[Permit] = []  # permits given back, the last one on top (handed out first)
        self._waited = False  # a slot found every permit taken in this window
        self._samples: list[float] = []
        self._handlers: list[float] = []  # the same leases' handler time per job
        self._batched = 0  # leases of this window that ran jobs of batched (fast) tasks
        self._fast = True  # the last window with samples: most leases ran fast tasks' jobs
        self._window_start = clock()
        self._medians: deque[float] = deque(maxlen=history)
        self.changes = 0  # how often the limit moved (for logs and tests)
        log.debug("lease limit starts at %d of %d slots (%s)", self.limit, slots, "adaptive" if adaptive else "fixed")

    @property
    def held(self) -> int:
        return self._held

    def try_acquire(self) -> Permit | None:
        """A permit now, or None: every permit the limit allows is held. A slot that gets None waits
        where the worker can still hand it a batch's jobs (Worker._park: they run in their claim's
        transaction, so they need no lease and no permit of their own); ``on_free`` says when to try
        again. A None counts as a slot waiting for a permit (the limit grows only while one does).
        The permit given back last is handed out first (its ``state`` is the warmest)."""
        with self._lock:
            grown = self._tick()
            if self._held >= self.limit:
                self._waited = True
                permit = None
            else:
                self._held += 1
                permit = self._free.pop() if self._free else Permit()
        self._announce(grown)
        return permit

    def _announce(self, n: int) -> None:
        if n > 0 and self.on_free is not None:
            self.on_free(n)

    def share(self, processes: int) -> None:
        """``processes`` live worker processes (this one included) claim from the same database: while
        its leases run batches, this process keeps at most its share of ``start`` permits, at least
        one -- so 8 processes of 8 slots hold about as many leases as one process of 16, not 64. Each process's own adaptation cannot see
        that: a lease more in one process barely moves its claims' latency, while every process doing
        the same collapses them all (measured on 2 cores, 1 ms jobs, 8 x 8 slots: 540-590 jobs/s
        against 5,000+ with two permits each; docs/benchmarks.md). It binds while most leases run
        jobs of tasks the worker batches (fast ones: many rows held per lease); slower jobs, claimed
        one at a time, still adapt up to every slot."""
        if not self.adaptive:
            return
        with self._lock:
            before, self.cap = self.cap, max(1, min(self.slots, -(-self.start // max(1, processes))))
            # More processes than before: every job length starts again from the share (slower jobs
            # then grow past it while their leases stay cheap, against a baseline measured there).
            if self.limit > self.cap and (self._fast or self.cap < before):
                log.debug("lease limit %d -> %d of %d slots: %d worker processes share the database",
                          self.limit, self.cap, self.slots, processes)
                self.limit = self.cap
                self.changes += 1

    def over(self) -> bool:
        """More permits are held than the limit now allows (it fell): a holder should give its back."""
        return self._held > self.limit

    def release(self, permit: Permit, announce: bool = True) -> None:
        """Give ``permit`` back. Announced to ``on_free`` unless the limit fell below the permits held,
        or ``announce`` is false: its holder goes idle (its claim found no more work) with its session
        open, and takes a permit again on its next wake-up -- a parked slot told of it would open a
        session of its own only to find the same nothing (see Worker._idle)."""
        with self._lock:
            self._held -= 1
            self._free.append(permit)
            free = announce and self._held < self.limit  # (not when the limit fell below the permits held)
        self._announce(1 if free else 0)

    def tick(self) -> None:
        """Close the window if it is over, and move the limit -- for a worker in which no lease ends
        and no slot asks for a permit (either does this too)."""
        with self._lock:
            grown = self._tick()
        self._announce(grown)

    def observe(self, seconds: float, batched: bool = False, handler: float = 0.0) -> None:
        """One lease's overhead per job: its wall time less its handlers' time, per job it ran;
        ``handler``: its handlers' time per job. ``batched``: its jobs are of tasks the worker
        batches (fast ones), whether or not this claim found more than one."""
        if not self.adaptive:
            return
        with self._lock:
            self._samples.append(seconds)
            self._handlers.append(handler)
            if batched:
                self._batched += 1
            grown = self._tick()
        self._announce(grown)

    def _tick(self) -> int:
        """Close the window if it is over, and move the limit (called with the lock held); returns how
        far it grew (0: it did not)."""
        if not self.adaptive:
            return 0
        now = self._clock()
        if now - self._window_start < self.window:
            return 0
        samples, handlers, waited, batched = self._samples, self._handlers, self._waited, self._batched
        self._samples, self._handlers, self._waited, self._batched, self._window_start = [], [], False, 0, now
        before = self.limit
        # The share (see share()) binds while most leases run fast (batched) tasks' jobs: many rows held
        # per lease is what every other claim steps over. Leases of slower jobs, claimed one at a time,
        # adapt up to every slot. A window without samples keeps the last window's view (at start: fast),
        # so a worker does not grow past its share before its first leases have shown what they run.
        if samples:
            self._fast = 2 * batched >= len(samples)
        cap = self.cap if self._fast else self.slots
        why = ""
        if len(samples) >= self.min_samples:
            m, h = median(samples), median(handlers)
            self._medians.append(m)
            baseline = min(self._medians)
            if m > self.tolerance * baseline and m - baseline > self.slack and h + m > self.tolerance * (h + baseline):
                floor = min(self.floor, cap)
                self.limit = max(floor, int(self.limit * max(0.5, self.tolerance * (h + baseline) / (h + m))))
                why = "slower leases"
            elif self.limit > cap:  # batches again (after slower jobs): back to the share
                self.limit = cap
                why = "back to the share"
            elif waited and self.limit < cap:
                self.limit = min(cap, self.limit + max(1, self.limit // 8))
                why = "leases within tolerance of the baseline, slots waiting"
            if why and self.limit != before:
                why += (f" (overhead per job {m * 1000:.2f} ms against a baseline of {baseline * 1000:.2f} ms,"
                        f" handlers {h * 1000:.2f} ms, {len(samples)} leases)")
        elif waited:  # few leases ended: long jobs (or a few long batches), not evidence of contention
            self.limit = max(self.limit, min(cap, self.limit * 2))
            why = f"slots waiting, {len(samples)} leases ended in the window"
        if self.limit != before:
            self.changes += 1
            log.debug("lease limit %d -> %d of %d slots: %s", before, self.limit, self.slots, why)
        return max(0, self.limit - before)
