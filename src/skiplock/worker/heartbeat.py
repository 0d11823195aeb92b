"""Heartbeats for claimed-lease jobs: one thread per worker renews every lease it holds.

It runs in its own thread with its own pooled connection, so leases keep being renewed while a sync
handler blocks (sleep, I/O, C code that releases the GIL). A lease the heartbeat finds no longer
ours (rescued after a pause, or cancelled) is marked lost; the executor's fenced finishing write will
be refused for it anyway.
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

from ..maintenance.service import Service

if TYPE_CHECKING:
    from ..backend.base import Backend


class Heartbeat(Service):
    name = "heartbeat"

    def __init__(self, backend: "Backend", interval: float):
        super().__init__(interval)
        self.backend = backend
        self._held: dict[int, tuple[uuid.UUID, float]] = {}
        self._lost: set[int] = set()
        self._lock = threading.Lock()

    def hold(self, job_id: int, owner: uuid.UUID, lease_seconds: float) -> None:
        with self._lock:
            self._held[job_id] = (owner, lease_seconds)
            self._lost.discard(job_id)

    def release(self, job_id: int) -> bool:
        """Stop renewing; True if the heartbeat had found the lease lost."""
        with self._lock:
            self._held.pop(job_id, None)
            lost = job_id in self._lost
            self._lost.discard(job_id)
            return lost

    def step(self) -> None:
        with self._lock:
            leases = [(job_id, owner, seconds) for job_id, (owner, seconds) in self._held.items()]
        if not leases:
            return
        kept = self.backend.heartbeat(leases)
        with self._lock:
            for job_id, _, _ in leases:
                if job_id not in kept and job_id in self._held:
                    self._lost.add(job_id)
