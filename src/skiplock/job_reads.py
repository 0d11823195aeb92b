"""The read model's job list, counts by filter, throughput, pickup latency and audit log (mixed into ``ReadModel``).

Guarantees: every call only reads (no lock taken, nothing written). A :class:`JobFilter` is checked before anything is
sent (a clear ValueError for an unknown state, a datetime without a time zone, or a text that is empty,
over 1000 characters or holds NUL). Lists are keyset pages (pages.py), newest first. An ``args`` text
search, which no index can serve, reads at most ``ARGS_WINDOW`` ids per page, so its cost is bounded
whatever the table's size: a page may come back short (even empty) with a cursor to the next, older,
window, and no job is skipped or repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .pages import Page, check_limit, make_cursor, read_cursor

# An args-text search reads at most this many ids per page (see JobReads.find_jobs).
ARGS_WINDOW = 20_000


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list or a bulk action covers; every field None means any. ``state`` as the read
    model shows it (``running`` includes transaction-lease jobs in flight, ``queued`` leaves them out);
    ``error_class`` as :class:`FailureClass` computes it; ``since``/``until``: the job's ``created_at``
    (``since`` inclusive, ``until`` exclusive); ``args``: a case-insensitive substring of the args'
    JSON text."""

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    args: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("state", "queue", "task", "error_class", "since", "until", "args")}

    def described(self) -> dict[str, str]:
        """The fields that are set, as text (for an audit row or a confirmation)."""
        return {k: (v.isoformat() if isinstance(v, datetime) else str(v)) for k, v in self.as_dict().items()
                if v is not None}


@dataclass(frozen=True)
class JobRow:
    """A job as a list shows it (no args, no result: see ``App.get_job`` for those; ``last_error``
    cut to its first 300 characters)."""

    id: int
    queue: str
    task: str
    state: str
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    worker: str | None


@dataclass(frozen=True)
class Throughput:
    """Jobs finished in one minute (``minute``: its start), by outcome."""

    minute: datetime
    done: int
    failed: int
    cancelled: int


@dataclass(frozen=True)
class Latency:
    """Seconds from a job's due time (``run_at``) to the start of its last attempt, over ``jobs`` jobs
    finished recently: the queue's latency as the jobs saw it (None: no job in the window)."""

    median: float | None
    p95: float | None
    max: float | None
    jobs: int


@dataclass(frozen=True)
class AuditEntry:
    """One action recorded by the dashboard: who (role and how it authenticated), what, on which
    filter or ids (``target``), how many rows it touched."""

    id: int
    at: datetime
    actor: str
    action: str
    target: dict[str, Any]
    affected: int


def _check_filter(flt: JobFilter) -> JobFilter:
    from .job import JobState

    if not isinstance(flt, JobFilter):
        raise ValueError(f"expected a JobFilter, got {flt!r}")
    if flt.state is not None and flt.state not in {s.value for s in JobState}:
        raise ValueError(f"unknown state {flt.state!r}; one of {', '.join(s.value for s in JobState)}")
    for name in ("since", "until"):
        value = getattr(flt, name)
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise ValueError(f"{name} must be a datetime with a time zone, got {value!r}")
    for name in ("queue", "task", "error_class", "args"):
        value = getattr(flt, name)
        if value is not None and (not isinstance(value, str) or not value or len(value) > 1000 or "\x00" in value):
            raise ValueError(f"{name} must be a non-empty text of at most 1000 characters, got {value!r}")
    return flt


class JobReads:
    """The read model's filtered job list, throughput and audit log (mixed into :class:`ReadModel`)."""

    backend: Any

    def find_jobs(self, flt: JobFilter = JobFilter(), *, limit: int = 50,
                  after: str | None = None) -> "Page[JobRow]":
        """The jobs matching ``flt``, newest first: a page of at most ``limit`` (keyset on id).

        With an ``args`` text (a substring of the args' JSON, which no index can find), one page reads
        at most ``ARGS_WINDOW`` ids below the cursor, so its cost is bounded whatever the table's size:
        it may come back short (even empty) with a cursor to search the next, older, window;
        ``page.searched_from`` says where this one stopped. No job is skipped or repeated."""
        key = read_cursor(after, "jobs")
        if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
            raise ValueError(f"not a cursor of jobs: {after!r}")
        params = _check_filter(flt).as_dict()
        limit = check_limit(limit)
        floor = None
        if flt.args is not None and hasattr(self.backend, "id_floor"):
            floor = self.backend.id_floor(key, ARGS_WINDOW)
            params["id_floor"] = floor
        items = [JobRow(**r) for r in self.backend.find_jobs(params, key, limit)]
        if len(items) == limit:
            return Page(items, make_cursor("jobs", items[-1].id), floor)
        if floor is not None and floor > 1:  # the window ended before the first job: search on below it
            return Page(items, make_cursor("jobs", floor), floor)
        return Page(items, None, floor)

    def count_jobs(self, flt: JobFilter = JobFilter(), *, cap: int = 10_000) -> tuple[int, bool]:
        """How many jobs match ``flt``, counted up to ``cap``: (count, more) -- ``more`` True when
        more than ``cap`` match (the count is then ``cap``)."""
        ids = self.backend.matching_job_ids(_check_filter(flt).as_dict(), None, check_limit(cap) + 1)
        return min(len(ids), cap), len(ids) > cap

    def matching_ids(self, flt: JobFilter, *, limit: int = 1000, before: int | None = None) -> list[int]:
        """The ids of the jobs matching ``flt``, newest first, below ``before`` (a bulk action's pages)."""
        return self.backend.matching_job_ids(_check_filter(flt).as_dict(), before, check_limit(limit))

    def throughput(self, within: timedelta = timedelta(hours=1)) -> list[Throughput]:
        """Jobs finished per minute over the last ``within`` (minutes with none are absent)."""
        return [Throughput(*r) for r in self.backend.throughput(within.total_seconds())]

    def pickup_latency(self, within: timedelta = timedelta(hours=1)) -> "Latency | None":
        """How long ready jobs waited for a worker (due -> started, wake-up included), over the jobs
        finished in the last ``within``; None when the backend cannot tell (no ``pickup_latency``)."""
        fetch = getattr(self.backend, "pickup_latency", None)
        if fetch is None:
            return None
        median, p95, worst, jobs = fetch(within.total_seconds())
        return Latency(median, p95, worst, jobs)

    def last_fire(self, schedule: str) -> datetime | None:
        """When the periodic schedule ``schedule`` last enqueued a job (its last tick), or None."""
        return self.backend.last_tick(schedule)

    def audit_log(self, *, limit: int = 100, after: str | None = None) -> "Page[AuditEntry]":
        """The dashboard's audit log, newest first (keyset on id)."""
        key = read_cursor(after, "audit")
        if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
            raise ValueError(f"not a cursor of audit: {after!r}")
        items = [AuditEntry(r[0], r[1], r[2], r[3], dict(r[4] or {}), int(r[5]))
                 for r in self.backend.audit_rows(key, check_limit(limit))]
        return Page(items, make_cursor("audit", items[-1].id) if len(items) == limit else None)
