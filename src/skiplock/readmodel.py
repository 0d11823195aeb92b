"""The read model: what is running, who runs it, what failed, what waits -- as typed values, for the
command line (``skiplock status``, ``jobs``, ``workers``) and a dashboard.

Get it from an App: ``app.read_model``. Every call is one read-only statement (no lock taken, nothing
written), so it can be polled freely; lists come a page at a time by keyset (:class:`Page`: pass
``page.cursor`` back as ``after=`` for the next page), never by OFFSET -- rows added or removed
meanwhile never make a page repeat or skip a row that stayed.

**What "running" means** (:meth:`ReadModel.running_now`, and the ``running`` state of
``App.get_job``, ``App.list_jobs``, ``App.counts``): a job whose handler is executing now, whichever
its lease:

- *claimed lease*: the job's row is ``running`` (its claim committed). It stays so until its fenced
  finishing write, or until the rescuer returns it to the queue once its lease expired: a worker that
  died is shown running (with ``lease_expires_at`` in the past) for at most ``lease_seconds`` plus the
  rescuer's interval.
- *transaction lease*: the row still says ``queued`` (the lease transaction holds its lock and has not
  committed), but the attempt was recorded before the handler started, on a separate connection,
  with the lease session's backend pid. The job is running while that attempt has no committed
  outcome and that session is alive, in the transaction that claimed the job (``xact_start`` no
  later than the attempt). **Staleness bound:** exact as of the statement for a worker that exits or
  is killed (its sessions end with it: not shown running, and ``queued`` again, as soon as the server
  has ended the session); a worker whose host vanishes is shown running until the server ends its
  session (TCP keepalives / ``tcp_user_timeout``, about 30 s, or ``lease_timeout``). "Running" starts
  when the attempt is recorded, just before the handler (a suspect -- a job whose last run never
  finished -- is shown running while it waits for its process's other handlers to finish, holding
  its lock, before it runs alone) and lasts until its outcome commits.
- *batches*: jobs claimed together (fast jobs sharing one transaction) record no attempt each, so
  which one runs is unknown and none of them is shown running; :meth:`ReadModel.batches_in_flight`
  shows the batch (its slot, since when, how many jobs it still holds).

Server sessions are read from ``pg_stat_activity`` once per statement, never per row; the role reading
must be able to see the worker sessions' ``xact_start`` (the same role as the workers, or
``pg_read_all_stats``), else no transaction-lease job shows as running.

**Workers** (:meth:`ReadModel.workers`) are the rows workers write themselves (``worker/presence.py``):
at start, every ``presence.SEEN_INTERVAL`` seconds, and deleted at exit. A worker that died without
deleting its row is listed until ``presence.LIVE_SECONDS`` after its last refresh.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from .backend.base import ReadBackend
from .job_reads import ARGS_WINDOW, AuditEntry, JobFilter, JobReads, JobRow, Latency, Throughput  # noqa: F401
from .pages import MAX_PAGE, Page, all_pages, check_limit, id_page, make_cursor, read_cursor  # noqa: F401


@dataclass(frozen=True)
class QueueCount:
    """How many jobs a queue has in one state (``running`` includes transaction-lease jobs in flight)."""

    queue: str
    state: str
    count: int


@dataclass(frozen=True)
class RunningJob:
    """A job in flight now (see the module's docstring for exactly when).

    ``worker`` is the worker's name (``host:pid`` unless it was given one) and ``slot`` its slot
    number; ``host`` and ``pid`` come from that worker's row in the workers table (None for a worker
    of an older skiplock, or one whose row is gone). ``since``: when this attempt started (the
    attempt's record for a transaction lease; the claim for a claimed lease). ``lease_expires_at``:
    claimed lease only -- in the past means its worker stopped renewing it (the rescuer will return it)."""

    job_id: int
    queue: str
    task: str
    lease: str  # "transaction" or "claimed"
    attempt: int
    max_attempts: int
    worker: str | None
    slot: int | None
    since: datetime | None
    lease_expires_at: datetime | None
    host: str | None
    pid: int | None
    worker_last_seen: datetime | None
    read_at: datetime

    @property
    def lease_expired(self) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at < self.read_at

    @property
    def running_for(self) -> timedelta | None:
        return None if self.since is None else self.read_at - self.since


@dataclass(frozen=True)
class BatchInFlight:
    """A batch whose transaction is open now: ``jobs`` of its jobs are still held (queued, locked);
    one of them runs, which one is not recorded."""

    batch_id: int
    worker: str | None
    slot: int | None
    since: datetime
    jobs: int


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker process as it describes itself (its row in the workers table). ``queues`` None:
    every queue. ``host``/``pid``/``concurrency`` are None for a worker of an older skiplock.
    ``running``: how many jobs it runs now (see :meth:`ReadModel.running_now`)."""

    id: uuid.UUID
    name: str
    host: str | None
    pid: int | None
    tasks: list[str]
    queues: list[str] | None
    concurrency: int | None
    started_at: datetime
    last_seen: datetime
    running: int
    read_at: datetime


@dataclass(frozen=True)
class FailureClass:
    """Failed jobs of a queue with the same error class: the text before the first ``:`` of the
    error's first line (an exception's type, or skiplock's own reason such as ``gave up``)."""

    queue: str
    error_class: str
    count: int
    last_failed_at: datetime | None


@dataclass(frozen=True)
class QueueAge:
    """Queued jobs of a queue that are due now and not in flight: how many, and how long the oldest
    has been due (``age``). ``paused``: nobody claims from the queue now."""

    queue: str
    ready: int
    oldest_run_at: datetime
    age: timedelta
    paused: bool


@dataclass(frozen=True)
class BoundedCount:
    """A count read without scanning every row: exact when ``exact`` (``n``), else more than ``n`` jobs
    match and ``estimate`` (None: unknown) says about how many (from a sample of the table's pages).
    ``str()``: the exact figure, or ``"≈ 198,800"`` / ``"> 1000"``."""

    n: int
    exact: bool = True
    estimate: int | None = None

    @property
    def approx(self) -> int:
        """The best figure known: the exact count, else the estimate (at least ``n + 1``)."""
        return self.n if self.exact else max(self.n + 1, self.estimate or 0)

    def __add__(self, other: "BoundedCount") -> "BoundedCount":
        if self.exact and other.exact:
            return BoundedCount(self.n + other.n)
        return BoundedCount(self.n + other.n, False, self.approx + other.approx)

    def __str__(self) -> str:
        if self.exact:
            return str(self.n)
        return f"≈ {self.approx:,}" if self.estimate is not None else f"> {self.n}"


@dataclass(frozen=True)
class QueueLimits:
    """A queue's flow-control limits (docs/flow-control.md): ``concurrency`` (jobs running at once),
    ``rate`` ("100/min"), ``fair`` (round-robin across partitions) with its partitions' ``weights``.
    ``str()``: "concurrency 5, 100/min, fair (a=3)"."""

    concurrency: int | None
    rate: str | None
    fair: bool
    weights: dict[str, int]

    def __str__(self) -> str:
        fair = ("fair" + (" (" + ", ".join(f"{p}={w}" for p, w in sorted(self.weights.items())) + ")"
                          if self.weights else "")) if self.fair else ""
        parts = [f"concurrency {self.concurrency}" if self.concurrency is not None else "", self.rate or "", fair]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class QueueSummary:
    """One queue at a glance, read in bounded time at any table size (:meth:`ReadModel.queue_summary`).

    ``counts``: jobs per state (every state present; ``running`` includes transaction-lease jobs in
    flight), each a :class:`BoundedCount` exact up to the cap. ``ready``: queued jobs due now and not
    in flight (exact up to the cap). ``head_due_at``/``head_age``: the ready job a worker claims next
    (first in the claim's order: priority, then run_at, then id) -- when it became due and how long it has waited,
    the queue's latency now; None when nothing is ready. (This is not always the oldest ready job:
    a higher-priority job is claimed first.) ``paused``: nobody claims from the queue now.
    ``limits``: its flow-control limits (:class:`QueueLimits`), None when it has none."""

    queue: str
    counts: dict[str, BoundedCount]
    ready: BoundedCount
    head_due_at: datetime | None
    head_age: timedelta | None
    paused: bool
    limits: QueueLimits | None = None


class ReadModel(JobReads):
    """Read-only views of the queue (see the module's docstring for what each promises)."""

    def __init__(self, backend: ReadBackend, live_seconds: float | None = None):
        from .worker.presence import LIVE_SECONDS

        self.backend = backend
        self.live_seconds = LIVE_SECONDS if live_seconds is None else live_seconds

    def counts(self) -> list[QueueCount]:
        """Jobs by queue and state (one snapshot); ``running`` includes transaction-lease jobs in flight."""
        return [QueueCount(q, s, n) for q, s, n in self.backend.counts()]

    def running_now(self, *, limit: int = 1000, after: str | None = None) -> Page[RunningJob]:
        """Every job in flight now, whichever its lease, by job id: a page of at most ``limit``."""
        return id_page("running", after, limit, self.backend.running_now, lambda r: RunningJob(*r), "job_id")

    def batches_in_flight(self, *, limit: int = 1000, after: str | None = None) -> Page[BatchInFlight]:
        """Batches whose transaction is open now, by batch id (their jobs are not in ``running_now``)."""
        return id_page("batches", after, limit, self.backend.batches_in_flight, lambda r: BatchInFlight(*r),
                        "batch_id")

    def workers(self, *, limit: int = 1000, after: str | None = None) -> Page[WorkerInfo]:
        """Every live worker process (seen within ``live_seconds``), oldest first."""
        key = read_cursor(after, "workers")
        parsed: tuple[datetime, uuid.UUID] | None = None
        if key is not None:
            try:
                parsed = (datetime.fromisoformat(key[0]), uuid.UUID(key[1]))
            except (TypeError, ValueError, IndexError, KeyError):
                raise ValueError(f"not a cursor of workers: {after!r}") from None
        rows = self.backend.live_worker_rows(self.live_seconds, parsed, check_limit(limit))
        items = [WorkerInfo(row[0], row[1], row[2], row[3], list(row[4]), None if row[5] is None else list(row[5]),
                            *row[6:]) for row in rows]
        cursor = None
        if len(items) == limit:
            last = items[-1]
            cursor = make_cursor("workers", [last.started_at.isoformat(), str(last.id)])
        return Page(items, cursor)

    def failures(self, since: datetime | timedelta | None = None) -> list[FailureClass]:
        """Failed jobs by queue and error class, most frequent first: every failed job still kept, or
        those that failed since ``since`` (a time, or how long ago)."""
        if isinstance(since, timedelta):
            since = datetime.now(timezone.utc) - since
        if since is not None and (not isinstance(since, datetime) or since.tzinfo is None):
            raise ValueError(f"since must be a timedelta or a datetime with a time zone, got {since!r}")
        return [FailureClass(q, c, int(n), at) for q, c, n, at in self.backend.failure_classes(since)]

    def queue_summary(self, *, cap: int = 1000) -> list[QueueSummary]:
        """Every queue with jobs, paused or with limits, by name, with its limits: counts per state and ready jobs exact up to ``cap``
        (then estimated), and the head of the queue's wait (see :class:`QueueSummary`). Its cost is
        bounded by the number of queues and ``cap``, not by the table's size (the dashboard's overview
        and queues page); :meth:`counts` and :meth:`oldest_ready` are exact but read every row.
        A backend without a bounded path (no ``queue_summary`` verb) gets exact figures from those two
        (its head is then the oldest ready job)."""
        from .job import JobState

        cap = check_limit(cap)
        states = [s.value for s in JobState]
        fetch = getattr(self.backend, "queue_summary", None)
        if fetch is None:
            raw = {"counts": self.backend.counts(),
                   "heads": [(q, n, oldest, age, paused) for q, n, oldest, age, paused in self.backend.oldest_ready()],
                   "estimates": []}
        else:
            raw = fetch(cap)
        estimates = {(q, s): int(n) for q, s, n in raw["estimates"]}
        out: dict[str, dict[str, Any]] = {}

        def entry(queue: str) -> dict[str, Any]:
            return out.setdefault(queue, {"counts": {s: BoundedCount(0) for s in states}, "ready": BoundedCount(0),
                                          "head_due_at": None, "head_age": None, "paused": False, "limits": None})

        def bounded(n: int, key: tuple[str, str] | None) -> BoundedCount:
            if fetch is None or n <= cap:  # without a bounded path every figure is exact
                return BoundedCount(int(n))
            return BoundedCount(cap, False, estimates.get(key) if key else None)

        for queue, state, n in raw["counts"]:
            entry(queue)["counts"][state] = bounded(int(n), (queue, state))
        for queue, ready, due, age, paused in raw["heads"]:
            e = entry(queue)
            e.update(ready=bounded(int(ready or 0), None), head_due_at=due, head_age=age, paused=bool(paused))
        for queue, limits in self.queue_limits().items():
            entry(queue)["limits"] = limits
        return [QueueSummary(q, **out[q]) for q in sorted(out)]

    def queue_limits(self) -> dict[str, QueueLimits]:
        """Every queue's flow-control limits (none on a backend without flow control)."""
        from .flow import format_rate

        capabilities = getattr(self.backend, "capabilities", None)
        fetch = getattr(self.backend, "queue_limits", None)
        if capabilities is None or not capabilities.flow_control or fetch is None:
            return {}
        return {q: QueueLimits(c, None if n is None else format_rate(n, p), bool(fair), dict(weights or {}))
                for q, c, n, p, _at, fair, weights in fetch()}

    def oldest_ready(self) -> list[QueueAge]:
        """Per queue with jobs due now: how many wait, and the oldest one's age."""
        return [QueueAge(q, int(n), oldest, age, bool(paused)) for q, n, oldest, age, paused in
                self.backend.oldest_ready()]


__all__: Sequence[str] = ("Page", "QueueCount", "BoundedCount", "QueueSummary", "RunningJob", "BatchInFlight", "WorkerInfo", "FailureClass",
                          "QueueAge", "ReadModel", "all_pages", "JobFilter", "JobRow", "Throughput", "AuditEntry", "Latency")
