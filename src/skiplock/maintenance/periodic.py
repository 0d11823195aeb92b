"""Cron schedules: pure helpers (next/previous tick, validation) and the scheduler service.

Exactly once per tick: every scheduler that finds a tick due tries to insert (schedule, tick) into
``periodic_ticks``; the primary key lets one insert win, and the winner enqueues the job in the same
transaction. There is no leader to elect, so two leaders can never both enqueue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..backend.base import NewJob
from ..errors import ConfigurationError
from .service import Service

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.periodic")
MISSED = ("skip", "run_once")


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

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, in UTC."""
        it = croniter(self.cron, moment.astimezone(self.tz))
        return it.get_next(datetime).astimezone(timezone.utc)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment``, in UTC."""
        local = moment.astimezone(self.tz)
        it = croniter(self.cron, local)
        prev = it.get_prev(datetime)
        following = croniter(self.cron, prev).get_next(datetime)
        return (following if following <= local else prev).astimezone(timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Scheduler(Service):
    """Enqueues each due tick of every schedule of an app (exactly once across all schedulers)."""

    name = "periodic"

    def __init__(self, app: "App", interval: float = 1.0, clock: Callable[[], datetime] = utcnow):
        super().__init__(interval)
        self.app = app
        self.clock = clock
        self.enqueued: list[tuple[str, datetime, int]] = []
        self._next: dict[str, datetime] = {}

    def catch_up(self, now: datetime | None = None) -> None:
        """Decide where each schedule starts: after ``now`` (skip missed ticks) or, for
        ``run_once`` schedules, at the latest tick missed since the last one recorded."""
        now = now or self.clock()
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
        now = now or self.clock()
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
