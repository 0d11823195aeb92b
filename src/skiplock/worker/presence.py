"""A running worker's row in the ``workers`` table: its task names and queues, so ``skiplock status``
and ``skiplock jobs`` can show queued jobs that no running worker can take (schema migration 7), and
which process it is -- host, OS pid, number of slots (migration 9) -- so the read model
(:mod:`skiplock.readmodel`: ``skiplock workers``, ``skiplock status``) lists every live worker
process and names the process of each running job.

The row is written before the worker claims anything, refreshed every ``SEEN_INTERVAL`` seconds, and
deleted when the worker exits. A worker that dies without deleting it (SIGKILL, a lost machine) stops
counting as running ``LIVE_SECONDS`` after its last refresh. The row is advisory: it drives what
status shows, never what is claimed (a worker claims only its own tasks whatever the table says).
The number of live rows also gives each worker its share of leases (``Governor.share``): it decides
how many slots claim at once, never which jobs.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import DatabaseError, DatabaseUnavailable
from ..maintenance.service import Service

if TYPE_CHECKING:
    from ..backend.base import Backend

log = logging.getLogger("skiplock.worker")

SEEN_INTERVAL = 10.0
LIVE_SECONDS = 3 * SEEN_INTERVAL
QUICK_INTERVAL, QUICK_PASSES = 1.0, 5  # the first refreshes after start


class Presence(Service):
    name = "presence"

    def __init__(self, backend: "Backend", worker: str, tasks: Sequence[str], queues: Sequence[str] | None,
                 interval: float = SEEN_INTERVAL, concurrency: int | None = None,
                 on_live: Callable[[int], None] | None = None):
        super().__init__(interval)
        self.on_live = on_live  # told, after each refresh, how many worker processes are live
        self.backend = backend
        self.id = uuid.uuid4()
        self.worker = worker
        self.tasks = sorted(tasks)
        self.queues = None if queues is None else list(queues)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.concurrency = concurrency

    def step(self) -> None:
        self.backend.worker_seen(self.id, self.worker, self.tasks, self.queues, host=self.host, pid=self.pid,
                                 concurrency=self.concurrency)
        if self.on_live is not None:
            self.on_live(max(1, self.backend.live_workers(LIVE_SECONDS)))

    def next_delay(self) -> float:
        # Workers started together see each other only once each has written its row: the first
        # few refreshes come sooner, so the count (the governor's share) settles within seconds.
        return min(self.interval, QUICK_INTERVAL) if self.passes < QUICK_PASSES else self.interval

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        try:
            self.backend.worker_gone(self.id)
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("could not remove this worker's row from the workers table (%s); it stops counting "
                        "as running %.0fs after its last refresh", exc, LIVE_SECONDS)
