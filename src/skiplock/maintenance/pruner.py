"""The pruner service: deletes finished jobs past their retention (see App.prune), paced so that
vacuum keeps up.

Why pace. Every deleted row is a dead tuple in ``jobs`` until vacuum removes it, and autovacuum
visits the table once its dead tuples pass a threshold (migration 0001: 2,000, scale factor 0). A
pruner that deletes everything due every ``interval`` (at 1,700 jobs/s and a 60 s interval: 100,000
rows) puts that whole burst on top of the queue's own churn at once: the soak benchmark saw 16 x the
threshold in dead tuples and a table that kept growing, because the space of a burst is only reused
after vacuum has caught up with it.

How. A pass deletes at most half the table's vacuum threshold (read each pass from the table's
storage parameters, else the server's settings: ``jobs_vacuum_threshold`` in queries.sql), in
batches of at most ``batch`` rows, each its own short transaction. Then:

- a *full* pass (it hit its limit: more is due) is followed by the next one after ``catch_up``
  seconds (0.2 s), so while there is work passes come back to back and the pruner keeps up with any
  rate up to about limit / catch_up (5,000 jobs/s at the default threshold), one bounded pass at a
  time;
- a *short* pass (everything due is gone) that deleted ``n`` rows due over the ``T`` seconds since the
  pass before schedules the next one when about half a pass will be due again,
  ``limit / 2 x T / n`` seconds, kept between ``catch_up`` and ``interval``: deletes follow the rate
  jobs finish at instead of piling up for ``interval``;
- a pass that deleted nothing (or whose predecessor is unknown) waits the normal ``interval``.

So the dead tuples one pass adds are bounded by half the vacuum threshold whatever the backlog, and
in steady state the pruner deletes about what finished, spread over the interval. It does not wait
for autovacuum between passes (n_dead_tup): at high rates the queue's own updates keep the table
above its threshold, so such a wait would stop pruning and let the table grow instead.

Guarantees kept (App.prune's): SKIP LOCKED, so a pass never blocks the queue; only finished states,
never a queued or running job; each state's retention; one process at a time per batch (the
maintenance advisory lock; with several workers their pruners' batches interleave, each pass still
bounded). ``skiplock prune`` and App.prune delete everything due at once.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ..lifecycle import SYSTEM_CLOCK, Clock
from .service import Service

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.pruner")

CATCH_UP = 0.2  # seconds between passes while more is due
MIN_PASS = 50  # rows: the least a pass may delete, whatever the threshold
BATCH = 1000  # rows per transaction at most (App.prune's default batch)


@dataclass(frozen=True)
class PrunePass:
    """One pass: rows deleted (in all, and by state), its limit, and the delay before the next."""

    deleted: int
    limit: int
    next_delay: float
    by_state: dict[str, int] = field(default_factory=dict)


class Pruner(Service):
    """Deletes finished jobs past their retention in paced passes (see the module's docstring).
    ``pass_limit`` overrides the rows per pass (default: half the jobs table's vacuum threshold);
    ``recent`` holds the last passes, newest last (for tests and monitoring)."""

    name = "pruner"

    def __init__(self, app: "App", interval: float = 60.0, *, catch_up: float = CATCH_UP,
                 pass_limit: int | None = None, clock: Clock = SYSTEM_CLOCK):
        if pass_limit is not None and (isinstance(pass_limit, bool) or not isinstance(pass_limit, int) or pass_limit < 1):
            raise ConfigurationError(f"pass_limit must be a positive number of rows, got {pass_limit!r}")
        super().__init__(interval, clock=clock)  # the pace is measured on this clock (tests: a ManualClock)
        self.app = app
        self.catch_up = min(catch_up, interval)
        self.pass_limit = pass_limit
        self.recent: deque[PrunePass] = deque(maxlen=100)
        self._delay = interval
        self._last_start: float | None = None
        self._last_ticks = float("-inf")
        self._last_log = float("-inf")
        self._unlogged: dict[str, int] = {}

    def next_delay(self) -> float:
        return self._delay

    def limit(self) -> int:
        """Rows one pass may delete: half the table's autovacuum threshold (at least MIN_PASS)."""
        if self.pass_limit is not None:
            return self.pass_limit
        return max(MIN_PASS, int(self.app._ready().jobs_vacuum_threshold() // 2))

    def step(self) -> None:
        self._delay = self.interval  # a pass that fails waits the normal interval
        start = self.clock.monotonic()
        limit = self.limit()
        ticks = start - self._last_ticks >= self.interval  # old ticks and dead batches: once an interval
        by_state = self.app._prune(self.app.retention, min(BATCH, limit), limit, ticks)
        if ticks:
            self._last_ticks = start
        deleted = sum(by_state.values())
        self._delay = self._pace(deleted, limit, start)
        self._last_start = start
        self.recent.append(PrunePass(deleted, limit, self._delay, by_state))
        self._log(by_state, start)

    def _pace(self, deleted: int, limit: int, start: float) -> float:
        if deleted >= limit:
            return self.catch_up
        if deleted == 0 or self._last_start is None:
            return self.interval
        due_over = start - self._last_start
        return min(self.interval, max(self.catch_up, limit / 2 * due_over / deleted))

    def _log(self, by_state: dict[str, int], now: float) -> None:
        """One INFO line per interval at most, with what was deleted since the last one."""
        for state, n in by_state.items():
            if n:
                self._unlogged[state] = self._unlogged.get(state, 0) + n
        if self._unlogged and now - self._last_log >= self.interval:
            log.info("pruned finished jobs: %s", ", ".join(f"{n} {s}" for s, n in self._unlogged.items()))
            self._unlogged.clear()
            self._last_log = now
