"""A worker's counts of what its jobs came to: ``Worker.run()`` and ``AsyncWorker.run()`` return them.

Each finished attempt is counted once, under the lock (slots are threads), by its outcome's kind:
``done``, ``retried`` (a ``RetryLater``: an error or ``Retry``, to run again), ``failed``, ``snoozed``,
``cancelled``, ``lost`` (``LeaseLost``: its lease was rescued or cancelled meanwhile, so its write
was refused). ``reconnects``: a slot's database errors it recovered from; ``aborted``: stopped with
``stop(abort=True)``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..job import Cancelled, Done, Failed, LeaseLost, RetryLater, Snoozed


@dataclass
class WorkerStats:
    done: int = 0
    retried: int = 0
    failed: int = 0
    snoozed: int = 0
    cancelled: int = 0
    lost: int = 0
    reconnects: int = 0
    aborted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, outcome: object) -> None:
        with self._lock:
            if isinstance(outcome, Done):
                self.done += 1
            elif isinstance(outcome, RetryLater):
                self.retried += 1
            elif isinstance(outcome, Failed):
                self.failed += 1
            elif isinstance(outcome, Snoozed):
                self.snoozed += 1
            elif isinstance(outcome, Cancelled):
                self.cancelled += 1
            elif isinstance(outcome, LeaseLost):
                self.lost += 1
