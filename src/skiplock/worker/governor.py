"""How many of a worker's slots hold a lease at once: adapted to what the database can take.

Why a limit at all. Under the transaction lease a job's row stays locked in the queue index while its
handler runs, so every claim -- from this process and from every other worker -- steps over the rows
held by all running leases (and over the index entries of jobs finished too recently for the server
to drop them). A claim's cost therefore grows with the number of leases in flight, and past the point
where the database (or the machine's cores) is saturated, more slots make every claim slower and the
worker as a whole slower: measured on 2 cores with 1 ms jobs, the median claim took 1.6 ms with 4
slots, 6 ms with 16, 19 ms with 64 and 143 ms with 256, and throughput fell from 4,300 to 370 jobs/s
(docs/benchmarks.md, "Slot and process sweep").

What it does. A slot takes a *permit* before it claims and gives it back when its lease ends (the
claim found nothing, or the transaction committed). The number of permits adapts, in the manner of
TCP Vegas, to the claim's latency: it starts at ``start`` and, while slots are waiting for a permit,
doubles each window in which claims are about as fast as the fastest recent windows (the *baseline*:
the lowest window median of the last ``history`` windows); when a window's median claim takes more
than ``tolerance`` times the baseline (and at least ``slack`` seconds more), the limit shrinks in
proportion, never below ``floor``. Claims that find nothing are not samples (they do not skip the
same rows), and a window with fewer than ``min_samples`` claims gives no evidence of contention: the
limit then grows if slots are waiting -- so long-running jobs, whose claims are rare and cheap, get
every slot. Each worker process adapts on its own claims; processes sharing a database all back off
when its claims slow down, so together they settle where claims are fast again.

Guarantees: it never changes what runs or in which lease, only when a slot may claim; a slot
waiting for a permit holds no transaction and no row lock; ``stop`` releases every waiter.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from statistics import median
from typing import Callable


class Governor:
    def __init__(self, slots: int, *, start: int = 16, floor: int = 4, tolerance: float = 2.0,
                 slack: float = 0.002, window: float = 0.25, min_samples: int = 8, history: int = 40,
                 adaptive: bool = True, clock: Callable[[], float] = time.monotonic):
        self.slots = slots
        self.adaptive = adaptive
        self.floor = min(slots, floor)
        self.limit = slots if not adaptive else max(self.floor, min(slots, start))
        self.tolerance = tolerance
        self.slack = slack
        self.window = window
        self.min_samples = min_samples
        self._clock = clock
        self._cond = threading.Condition()
        self._held = 0
        self._waited = False  # a slot waited for a permit in this window
        self._samples: list[float] = []
        self._window_start = clock()
        self._medians: deque[float] = deque(maxlen=history)
        self.changes = 0  # how often the limit moved (for logs and tests)

    @property
    def held(self) -> int:
        return self._held

    def acquire(self, stopping: threading.Event) -> bool:
        """Wait for a permit; False (and no permit) once ``stopping`` is set."""
        with self._cond:
            while self._held >= self.limit:
                if stopping.is_set():
                    return False
                self._waited = True
                self._cond.wait(0.05)
                self._tick()
            self._held += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def observe(self, seconds: float) -> None:
        """One lease's overhead per job: its wall time less its handlers' time, per job it ran."""
        if not self.adaptive:
            return
        with self._cond:
            self._samples.append(seconds)
            self._tick()

    def _tick(self) -> None:
        """Close the window if it is over, and move the limit (called with the lock held)."""
        if not self.adaptive:
            return
        now = self._clock()
        if now - self._window_start < self.window:
            return
        samples, waited = self._samples, self._waited
        self._samples, self._waited, self._window_start = [], False, now
        before = self.limit
        if len(samples) >= self.min_samples:
            m = median(samples)
            self._medians.append(m)
            baseline = min(self._medians)
            if m > self.tolerance * baseline and m - baseline > self.slack:
                self.limit = max(self.floor, int(self.limit * max(0.5, self.tolerance * baseline / m)))
            elif waited:
                self.limit = min(self.slots, self.limit + max(1, self.limit // 8))
        elif waited:
            self.limit = min(self.slots, self.limit * 2)
        if self.limit != before:
            self.changes += 1
            if self.limit > before:
                self._cond.notify_all()
