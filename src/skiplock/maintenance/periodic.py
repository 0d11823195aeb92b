"""Cron schedules: pure helpers (next/previous tick, validation) and the scheduler service.

Exactly once per tick: every scheduler that finds a tick due tries to insert (schedule, tick) into
``periodic_ticks``; the primary key lets one insert win, and the winner enqueues the job in the same
transaction. There is no leader to elect, so two leaders can never both enqueue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..backend.base import NewJob
from ..errors import ConfigurationError
from ..lifecycle import SYSTEM_CLOCK, Clock
from .service import Service

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.periodic")
MISSED = ("skip", "run_once")
# Wall-clock order and UTC order disagree only within an hour the clock repeats: walks of wall-clock
# times look this far beyond it (larger than any daylight-saving shift in the tz database).
FOLD_MARGIN = timedelta(hours=3)
# The longest clock jump forward searched for the end of a skipped interval (Samoa skipped a day).
GAP_MINUTES = 26 * 60


@dataclass(frozen=True)
class Schedule:
    """A task on a cron expression in a time zone. ``args_json`` is the validated job arguments."""

    name: str
    cron: str
    args_json: str
    tz: ZoneInfo
    missed: str

    @classmethod
    def create(cls, name: str, cron: str, args_json: str, tz: str, missed: str) -> "Schedule":
        if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
            raise ConfigurationError(f"invalid cron expression {cron!r}: expected 5 fields "
                                     "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'")
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigurationError(f"unknown time zone {tz!r} (use an IANA name such as 'Europe/Paris')") from None
        if missed not in MISSED:
            raise ConfigurationError(f"missed must be one of {', '.join(MISSED)}, got {missed!r}")
        return cls(name, cron, args_json, zone, missed)

    @property
    def wildcard(self) -> bool:
        """cron's "wildcard job": its minute or hour field starts with ``*`` (``0 * * * *``,
        ``*/15 * * * *``). It follows elapsed time across a daylight-saving change; a fixed-time
        schedule (``30 2 * * *``) follows the wall clock instead -- see :meth:`instants`."""
        minute, hour = self.cron.split()[:2]
        return minute.startswith("*") or hour.startswith("*")

    def instants(self, wall: datetime) -> list[datetime]:
        """The UTC instants at which the local wall-clock time ``wall`` (naive) fires, the way
        Vixie cron treats daylight-saving changes:

        - a time that happens once: that instant;
        - a time that happens twice (the clock goes back): a fixed-time schedule fires once, at the
          first occurrence; a wildcard schedule at both (each is a real hour that passed);
        - a time that does not happen (the clock goes forward): a fixed-time schedule fires at the
          change itself (the first wall-clock minute after the gap, e.g. 03:00); a wildcard schedule
          does not fire."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(timezone.utc)
        second = wall.replace(tzinfo=self.tz, fold=1).astimezone(timezone.utc)
        if first.astimezone(self.tz).replace(tzinfo=None) == wall:  # the time exists
            return [first, second] if self.wildcard and second != first else [first]
        if self.wildcard:
            return []
        after = wall
        for _ in range(GAP_MINUTES):
            after = (after + timedelta(minutes=1)).replace(second=0, microsecond=0)
            instant = after.replace(tzinfo=self.tz).astimezone(timezone.utc)
            if instant.astimezone(self.tz).replace(tzinfo=None) == after:
                return [instant]
        return []

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, in UTC (see :meth:`instants` for what a tick is
        around a daylight-saving change). croniter walks local wall-clock times (naive, so it never
        applies an offset itself); wall-clock order and UTC order differ only within a repeated
        hour, so the walk starts ``FOLD_MARGIN`` earlier and ends that much past the best found."""
        local = moment.astimezone(self.tz).replace(tzinfo=None)
        it = croniter(self.cron, local - FOLD_MARGIN)
        best: datetime | None = None
        while True:
            wall = it.get_next(datetime)
            if best is not None and wall > best.astimezone(self.tz).replace(tzinfo=None) + FOLD_MARGIN:
                return best
            for instant in self.instants(wall):
                if instant > moment and (best is None or instant < best):
                    best = instant

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment``, in UTC (the same walk as :meth:`next_after`,
        backwards)."""
        local = moment.astimezone(self.tz).replace(tzinfo=None)
        it = croniter(self.cron, local + FOLD_MARGIN + timedelta(minutes=1))
        best: datetime | None = None
        while True:
            wall = it.get_prev(datetime)
            if best is not None and wall < best.astimezone(self.tz).replace(tzinfo=None) - FOLD_MARGIN:
                return best
            for instant in self.instants(wall):
                if instant <= moment and (best is None or instant > best):
                    best = instant


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# The shortest pause between passes: a tick a few microseconds away is waited for, not spun on.
MIN_PAUSE = 0.01


class Scheduler(Service):
    """Enqueues each due tick of every schedule of an app (exactly once across all schedulers).

    When to run is decided here, from the clock: after a pass the scheduler waits until the earliest
    next tick of its schedules (computed from ``clock.now()``), at most ``interval`` seconds (so a
    wall-clock step -- NTP, a suspended machine -- is noticed within ``interval``). ``clock`` is a
    :class:`skiplock.lifecycle.Clock` (tests pass a ``ManualClock``: fires are decided without
    sleeping), or a callable returning the wall-clock time (the loop then waits on the real clock)."""

    name = "periodic"

    def __init__(self, app: "App", interval: float = 1.0, clock: Callable[[], datetime] | Clock = utcnow):
        if isinstance(clock, Clock):
            super().__init__(interval, clock=clock)
            self.wall: Callable[[], datetime] = clock.now
        else:
            super().__init__(interval, clock=SYSTEM_CLOCK)
            self.wall = clock
        self.app = app
        self.enqueued: list[tuple[str, datetime, int]] = []
        self._next: dict[str, datetime] = {}

    def catch_up(self, now: datetime | None = None) -> None:
        """Decide where each schedule starts: after ``now`` (skip missed ticks) or, for
        ``run_once`` schedules, at the latest tick missed since the last one recorded."""
        now = now or self.wall()
        backend = self.app.backend
        for s in self.app.schedules.values():
            self._next[s.name] = s.next_after(now)
            if s.missed == "run_once":
                last = backend.last_tick(s.name)
                latest = s.latest_at_or_before(now)
                if last is not None and latest > last:
                    self._enqueue(s, latest)

    def run_due(self, now: datetime | None = None) -> list[int]:
        """Enqueue the ticks that are due at ``now``; returns the ids this scheduler enqueued."""
        now = now or self.wall()
        if len(self._next) != len(self.app.schedules):
            self.catch_up(now)
        ids: list[int] = []
        for s in self.app.schedules.values():
            due = self._next[s.name]
            if due > now:
                continue
            latest = s.latest_at_or_before(now)  # ticks missed while this process was stalled: skipped
            job_id = self._enqueue(s, latest)
            if job_id is not None:
                ids.append(job_id)
            self._next[s.name] = s.next_after(latest)
        return ids

    def _enqueue(self, s: Schedule, tick: datetime) -> int | None:
        # The job is an ordinary job of the schedule's task: its queue, priority and attempts come from
        # the task, and so does its lease (``App.periodic(lease="claimed")``), applied by the worker
        # that runs it.
        task = self.app.tasks[s.name]
        job = NewJob(s.name, s.args_json, task.queue, task.priority, task.max_attempts, None)
        job_id = self.app.backend.enqueue_tick(s.name, tick, job)
        if job_id is not None:
            log.info("periodic %s: enqueued job %s for tick %s", s.name, job_id, tick.isoformat())
            self.enqueued.append((s.name, tick, job_id))
        return job_id

    def step(self) -> None:
        self.run_due()

    def next_delay(self) -> float:
        """Seconds until the earliest next tick, by the wall clock; at most ``interval``."""
        if not self._next:
            return self.interval
        until = (min(self._next.values()) - self.wall()).total_seconds()
        return min(self.interval, max(MIN_PAUSE, until))
