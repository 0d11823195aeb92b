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
  next read: within ``REFRESH_SECONDS`` while the named queues keep the worker busy, else at the
  next claim of them that comes back empty -- for a new job, the claim its NOTIFY wakes a slot for;
  for a resumed queue (a resume sends no NOTIFY), the polling slot's, within ``poll_interval``;
- with nothing paused, or more than ``MERGED_QUEUES_MAX`` queues with jobs, or only paused queues
  with jobs, the claim of every queue, as before (one read per ``REFRESH_SECONDS`` to know it).

Only on a backend with ``Capabilities.claimable_queues`` (PostgreSQL); the sync worker
(worker/claiming.py) and the asyncio worker (worker/aio_worker.py) alike.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

REFRESH_SECONDS = 1.0
# The most queues a claim names: the claim of named queues merges each queue's walk up to this many
# (MERGED_QUEUES_MAX in backend/postgres/queries.py); past it, it walks jobs_claim_any_idx, as the
# claim of every queue does.
MOST_NAMED = 16


class QueueView:
    """The queues to name in a worker's claims (``named``; None: every queue). Sans I/O: the worker
    reads ``claimable_queues`` on the claiming slot's lease when ``take_read`` says so (and after an
    empty claim of named queues), and hands the result to ``update`` -- the sync and asyncio workers
    the same way."""

    def __init__(self, most: int = MOST_NAMED, refresh: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.most = most
        self.refresh = REFRESH_SECONDS if refresh is None else refresh
        self._clock = clock
        self.named: list[str] | None = None
        self._read_at: float | None = None
        self.reads = 0  # how often the view was read (tests, logs)

    def take_read(self) -> bool:
        """Whether the next claim reads the view first (it is older than ``refresh``). Taken: the
        slots claiming meanwhile do not read it too, they claim with the view as it is (two slots
        that ask at once may both read: harmless)."""
        now, at = self._clock(), self._read_at
        if at is not None and now - at < self.refresh:
            return False
        self._read_at = now
        return True

    def update(self, paused: Sequence[str], queued: Sequence[str]) -> list[str] | None:
        """A read of the view -- ``claimable_queues``: the paused queues, the queues with queued jobs
        (at most ``most`` + 1) -- and the queues to name from now on."""
        self._read_at = self._clock()
        self.reads += 1
        held = set(paused)
        active = [q for q in queued if q not in held]
        # nothing paused; too many queues to name (the read stops past `most`); or nothing but paused
        # queues has jobs (naming none is no claim): every queue
        self.named = active if paused and active and len(queued) <= self.most else None
        return self.named
