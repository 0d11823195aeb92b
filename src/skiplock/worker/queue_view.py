"""Which queues a worker of every queue names in its claims while a queue is paused.

A worker of every queue (no ``queues``) claims by walking jobs_claim_any_idx in claim order, and a
paused queue's jobs on that walk are filtered out one heap read at a time: behind a paused backlog of
50,000 jobs a claim took 10-13 ms instead of about 0.1, and a worker of every queue drained the other
queues at 0.35-0.42 of its speed (docs/benchmarks.md, "Session 20"). While some queue is paused, the
worker names instead the queues that have queued jobs and are not paused, when there are at most
``MERGED_QUEUES_MAX`` of them: the claim of named queues walks each queue's own entries of
jobs_claim_idx, merged in claim order (``claim_of_queues_merged`` in queries.sql), and never reads a
paused backlog.

The view -- (paused queues, queues with queued jobs), ``claimable_queues`` in queries.sql: the paused
table and a loose index scan, one descent per queue -- is read in the claim's own transaction by the
first claim after ``REFRESH_SECONDS`` (one slot reads; the others claim with the view they have), and
again right after a claim that named queues came back empty: when that read names other queues, the
slot claims again with them, in the same transaction. What that means:

- a queue paused is never claimed from: the claim itself checks ``paused_queues``, whatever the view;
- a queue resumed, or one that gets its first jobs while another is paused, is claimed from at the
  next read: within ``REFRESH_SECONDS`` while the named queues keep the worker busy, at once when
  their claim comes back empty (a NOTIFY of its job wakes a slot, whose claim then finds nothing
  else);
- with nothing paused, or more than ``MERGED_QUEUES_MAX`` queues with jobs, or only paused queues
  with jobs, the claim of every queue, as before (one read per ``REFRESH_SECONDS`` to know it).

Only on a backend with ``Capabilities.claimable_queues`` (PostgreSQL); the asyncio worker does not
use it yet.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

REFRESH_SECONDS = 1.0
# The most queues a claim names: the claim of named queues merges each queue's walk up to this many
# (MERGED_QUEUES_MAX in backend/postgres/queries.py); past it, it walks jobs_claim_any_idx, as the
# claim of every queue does.
MOST_NAMED = 16


class QueueView:
    """The queues to name in a worker's claims (None: every queue), read through ``read`` --
    ``backend.claimable_queues`` -- on the claiming slot's lease."""

    def __init__(self, read: Callable[[Any, int], tuple[list[str], list[str]]], most: int,
                 refresh: float | None = None, clock: Callable[[], float] = time.monotonic):
        self._read = read
        self.most = most
        self.refresh = REFRESH_SECONDS if refresh is None else refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._named: list[str] | None = None
        self._read_at: float | None = None
        self.reads = 0  # how often the view was read (tests, logs)

    def queues(self, lease: Any) -> list[str] | None:
        """The queues the next claim names, None for every queue. Reads the view on ``lease`` first
        when it is older than ``refresh`` -- one slot at a time: another slot reading it meanwhile
        does not wait, it claims with the view as it is."""
        at = self._read_at
        if (at is None or self._clock() - at >= self.refresh) and self._lock.acquire(blocking=False):
            try:
                self._update(lease)
            finally:
                self._lock.release()
        return self._named

    def reread(self, lease: Any) -> list[str] | None:
        """After a claim that named queues came back empty: read the view again, on ``lease``, and
        return the queues to name now."""
        with self._lock:
            self._update(lease)
        return self._named

    def _update(self, lease: Any) -> None:
        paused, queued = self._read(lease, self.most)
        self._read_at = self._clock()
        self.reads += 1
        held = set(paused)
        active = [q for q in queued if q not in held]
        # nothing paused; too many queues to name (the read stops past `most`); or nothing but paused
        # queues has jobs (naming none is no claim): every queue
        self._named = active if paused and active and len(queued) <= self.most else None
