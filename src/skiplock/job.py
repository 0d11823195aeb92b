"""Job, its states, and the outcome values a run produces (deciding is separate from writing)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable

from .retry import check_delay

if TYPE_CHECKING:
    import psycopg


class JobState(str, enum.Enum):
    """Where a job is in its life. ``queued`` jobs are claimable once ``run_at`` has passed."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"  # a sequenced job waiting for the jobs before it (docs/flow-control.md)

    def __str__(self) -> str:
        return self.value


@dataclass
class Job:
    """A job as stored. While a handler runs, ``conn`` is the connection of the job's transaction:
    whatever the handler writes through it commits together with the job's ``done`` update, or not
    at all. ``attempt`` is the number of this run (1 for the first).

    The job's savepoint is taken when the handler first reads ``conn`` (a handler that never does
    has no database effects to undo, and costs no round trip for it)."""

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int = 0
    state: JobState = JobState.QUEUED
    attempts: int = 0
    max_attempts: int = 5
    run_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    worker: str | None = None
    unique_key: str | None = None
    lease_expires_at: datetime | None = None
    _conn: "psycopg.Connection[Any] | None" = field(default=None, repr=False, compare=False)
    _before_conn: "Callable[[], None] | None" = field(default=None, repr=False, compare=False)

    @property
    def conn(self) -> "psycopg.Connection[Any] | None":
        """The connection of the job's transaction while its handler runs (None otherwise)."""
        hook = self._before_conn
        if hook is not None:
            self._before_conn = None
            hook()
        return self._conn

    @property
    def attempt(self) -> int:
        """The number of the current (or last) attempt."""
        return self.attempts


# ---- what a handler can ask for ---------------------------------------------------------------


class Retry(Exception):
    """Raise from a handler to retry: after ``in_`` seconds, or the task's backoff if None. Counts as
    an attempt (the job still ends ``failed`` after ``max_attempts``).

    ``in_`` must be a finite number of seconds from 0 to 100 years (``retry.MAX_DELAY``); anything
    else (infinity, NaN, 1e300, negative) raises ValueError here, so a handler that asks for one
    ends its attempt with that error recorded (retried by the task's policy like any failure)."""

    def __init__(self, in_: float | None = None, reason: str = "retry requested by the handler"):
        if in_ is not None:
            in_ = check_delay(in_, "Retry(in_=...)")
        super().__init__(reason)
        self.in_ = in_


class Snooze(Exception):
    """Raise or return from a handler to run the job again after ``seconds`` without counting an
    attempt, in either lease mode. Its database writes are rolled back like any unfinished run.

    ``seconds`` must be a finite number from 0 to 100 years (``retry.MAX_DELAY``); anything else
    raises ValueError here, so the attempt fails with that error recorded (and counts)."""

    def __init__(self, seconds: float):
        seconds = check_delay(seconds, "Snooze(seconds)")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = seconds


class Cancel(Exception):
    """Raise from a handler to end the job ``cancelled`` (its database writes are rolled back)."""

    def __init__(self, reason: str = "cancelled by the handler"):
        super().__init__(reason)
        self.reason = reason


# ---- outcomes: what running a job decided; the backend writes them ----------------------------


@dataclass(frozen=True)
class Done:
    result: Any = None


@dataclass(frozen=True)
class RetryLater:
    delay: float
    error: str


@dataclass(frozen=True)
class Failed:
    error: str


@dataclass(frozen=True)
class Snoozed:
    delay: float


@dataclass(frozen=True)
class Cancelled:
    reason: str


@dataclass(frozen=True)
class LeaseLost:
    """Claimed lease: the job was rescued or cancelled meanwhile; our finishing write was refused."""

    attempted: "Outcome"


Outcome = Done | RetryLater | Failed | Snoozed | Cancelled | LeaseLost
