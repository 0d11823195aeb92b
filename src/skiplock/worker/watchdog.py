"""The worker's watchdog: bounds leases on a backend whose server does not
(``Capabilities.server_bounds_lease`` off; PostgreSQL bounds them itself).

While a transaction-lease job runs, the executor watches its lease for the limit PostgreSQL would
enforce: ``lease_timeout`` from the claim, tightened to the task's ``timeout`` from the handler's
start. A lease still held past its deadline is ended (``Lease.end``: the server session is ended
from another connection, so the transaction rolls back and the job is available again, then the
connection is closed); the attempt is then recorded failed with ``LeaseTimeout`` (see handler.py).
Checked every ``interval`` seconds, so a lease ends at most that much after its deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..errors import DatabaseError, DatabaseUnavailable
from ..maintenance.service import Service

if TYPE_CHECKING:
    from ..backend.base import Lease

log = logging.getLogger("skiplock.worker")


class Watchdog(Service):
    name = "watchdog"

    def __init__(self, interval: float = 0.2):
        super().__init__(interval)
        self._lock = threading.Lock()
        self._watched: dict[int, tuple["Lease", float, float]] = {}  # id(lease) -> (lease, deadline, limit)
        self._ended: set[int] = set()

    def watch(self, lease: "Lease", seconds: float) -> None:
        """End ``lease`` if it is still held ``seconds`` from now (or at its earlier deadline)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            held = self._watched.get(id(lease))
            if held is None or deadline < held[1]:
                self._watched[id(lease)] = (lease, deadline, seconds)

    def release(self, lease: "Lease") -> None:
        """The lease's transaction is over: stop watching it."""
        with self._lock:
            self._watched.pop(id(lease), None)
            self._ended.discard(id(lease))

    def ended(self, lease: "Lease") -> bool:
        """Whether the watchdog ended this lease while it was watched."""
        with self._lock:
            return id(lease) in self._ended

    def limit_of(self, lease: "Lease") -> float:
        with self._lock:
            held = self._watched.get(id(lease))
        return held[2] if held is not None else 0.0

    def step(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [(key, lease, limit) for key, (lease, deadline, limit) in self._watched.items()
                   if deadline <= now and key not in self._ended]
            self._ended.update(key for key, _, _ in due)
        for _, lease, limit in due:
            log.warning("a lease ran past its limit of %gs: ending it (session %s); its job is available again",
                        limit, lease.session_id)
            try:
                lease.end()
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("could not end an over-long lease's session (%s); its connection is closed", exc)
