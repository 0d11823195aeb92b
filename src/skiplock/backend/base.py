"""The backend interface: operations on jobs, not ``execute(sql)``.

A backend owns its SQL and its connections. The worker and the App only call these methods, so a
MySQL 8 / MariaDB 10.6+ backend (the same SKIP LOCKED claim, select-then-update in one transaction)
can slot in without touching them. ``PostgresBackend`` (backend/postgres/) is the implementation.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generator, Mapping, NamedTuple, Protocol, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond the verbs every backend has; the worker consults it
    (``backend.capabilities``) and opts out of what is missing:

    - ``batched_claims``: one claim may lock several jobs in one lease transaction (else every claim
      takes one job);
    - ``listen_notify``: enqueues wake idle workers (``connect_listener``; else the worker polls);
    - ``server_bounds_lease``: the server itself ends a lease transaction idle or open past
      ``lease_timeout`` or a task's ``timeout`` (PostgreSQL: idle_in_transaction_session_timeout,
      statement and transaction timeouts); else the worker's watchdog ends such leases
      (``Lease.end``);
    - ``flow_control``: concurrency and rate limits, partitions (docs/flow-control.md: ``claim_flow``,
      ``ensure_slots``, ``own_slots``, ``take_starts``, the queue-limit verbs); else a task or queue
      with limits, or a job with a ``partition``, is refused with a clear error;
    - ``claim_while_committing``: a batch may give its turn back before its COMMIT, so that another
      slot of the process claims while it commits (docs/batches.md, "Turns"). PostgreSQL: yes. MySQL
      and MariaDB: no -- there the next batch's ``start_batch`` found jobs of a batch still
      committing listed as suspects (tests/mysql/test_mysql_worker.py, about half the runs), so a
      batch keeps its turn until its COMMIT returns, as before;
    - ``claimable_queues``: the verb of :class:`QueueViewBackend`, and a claim of a few named queues
      that walks only their own jobs: a worker of every queue then names the queues that have jobs
      while one is paused (worker/queue_view.py). PostgreSQL: yes."""

    batched_claims: bool = True
    listen_notify: bool = True
    server_bounds_lease: bool = True
    flow_control: bool = False
    claim_while_committing: bool = False
    claimable_queues: bool = False


class Session(Protocol):
    """A backend-owned server session (a lease, or an attempt-counting connection). Its methods raise
    only skiplock errors: :class:`~skiplock.errors.ConnectionLost` when the session is gone,
    :class:`~skiplock.errors.DatabaseError` when the server refused a statement on a live session."""

    session_id: int  # the server's id of the session (PostgreSQL: the backend pid)

    def alive(self) -> bool:
        """False once the session is known gone (closed here, or its link found broken)."""
        ...

    def close(self) -> None: ...


class Lease(Session, Protocol):
    """A worker slot's session whose transactions are job leases.

    ``conn`` is what a handler sees as ``job.conn`` (its user-facing type is the driver's connection:
    a handler's own statements on it raise the driver's errors, which the worker treats like any
    handler exception). Everything the worker does with the lease goes through these methods."""

    conn: Any
    bounded_by_server: bool  # see Capabilities.server_bounds_lease

    def begin(self) -> None:
        """Start the lease transaction (a backend whose transactions start implicitly does nothing)."""
        ...

    def commit(self) -> None: ...
    def rollback(self) -> None: ...

    def let_go(self) -> None:
        """End a lease transaction that wrote nothing (a claim that found no job, or whose jobs it
        lets go untouched: their row locks are released alike): as ``rollback`` does, in whichever
        way the backend finds cheaper."""
        ...

    def savepoint(self) -> None: ...
    def rollback_to_savepoint(self) -> None: ...
    def release_savepoint(self) -> None: ...

    def in_transaction(self) -> bool:
        """A transaction is open and usable (no statement of it failed)."""
        ...

    def in_error(self) -> bool:
        """A transaction is open but a statement of it failed: only a rollback is possible."""
        ...

    def idle(self) -> bool:
        """Alive, with no transaction open."""
        ...

    def lost(self) -> bool:
        """The session was found gone (the server ended it, the link broke) -- not closed here on
        purpose (``close``/``end``)."""
        ...

    def end(self) -> None:
        """End the lease from outside its own session: the server ends the session (rolling its
        transaction back, so its jobs are available again), then the connection is closed. Safe to
        call from another thread, and on a lease already gone."""
        ...


class Via(enum.Enum):
    """Which finishing write ``Backend.finish`` makes (the backend chooses the SQL for each)."""

    LEASE = "lease"  # in the lease's transaction, not committed (the lease's COMMIT ends it)
    FRESH = "fresh"  # from a fresh transaction that never waits on a row lock (the lease is gone)
    BATCH_COMMIT = "batch_commit"  # a batch's deferred ``done`` writes, sent with the lease's COMMIT


class Write(NamedTuple):
    """One job's finishing write. ``state``: ``done`` (guarded: a pending cancellation refuses it),
    ``queued`` (retry or snooze after ``delay``), ``failed`` or ``cancelled``. ``undo``: roll back to
    the handler's savepoint first (it touched the database), and release it. ``release``: ``done``
    of a handler that touched the database -- release its savepoint first. Either way the job's own
    row is written by the top transaction, which holds its lock (never by a subtransaction: see
    ``savepoint`` in queries.sql). ``uncount``: give the attempt back (a snooze). ``owner``:
    claimed lease -- the write is fenced on state ``running`` and this owner.
    A named tuple: one is made per finished job, on the hot path."""

    job: ClaimedJob
    attempt: int
    state: str
    started_at: datetime
    worker: str
    result: str | None = None
    delay: float | None = None
    error: str | None = None
    uncount: bool = False
    undo: bool = False
    owner: uuid.UUID | None = None
    release: bool = False


class Finish(NamedTuple):
    """What ``Backend.finish`` writes, and how (``via``). ``batch``: the batch whose row a
    ``BATCH_COMMIT`` deletes."""

    via: Via
    writes: Sequence[Write]
    batch: int | None = None


@dataclass
class ClaimedJob:
    """A row locked by a lease transaction; the lease ends when that transaction does."""

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    claimed_at: datetime
    # flow control (``claim_flow``): the (key, slot number) of each concurrency slot this job holds
    slots: tuple[tuple[str, int], ...] = ()


class NewJob(NamedTuple):
    """A validated job ready to insert: ``args_json`` is already serialised and checked. A named
    tuple, not a frozen dataclass: a batch enqueue makes one per job, and a tuple costs less than half."""

    task: str
    args_json: str
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    partition: str | None = None  # flow control: the job's partition key (docs/flow-control.md)
    sequence: str | None = None  # sequences: the job's sequence key (docs/flow-control.md, "Sequences")
    sequence_on_failure: str | None = None  # 'wait', 'skip' or 'fail' (None without a sequence)


class Notifications(Protocol):
    """A listening session (``connect_listener``): the payloads of the wake-up notifications sent on
    the backend's channel. ``wait(timeout)`` returns as soon as one arrives (with any that came with
    it), or ``[]`` after ``timeout`` seconds; a dead session raises ``skiplock.errors.ConnectionLost``
    (only skiplock errors cross the seam)."""

    def wait(self, timeout: float) -> list[str]: ...
    def close(self) -> None: ...


class ReadBackend(Protocol):
    """The read model's statements (see readmodel.py: what "running" means, pages by keyset)."""

    def counts(self) -> list[tuple[str, str, int]]: ...
    def running_now(self, after: int | None, limit: int) -> list[tuple[Any, ...]]: ...
    def batches_in_flight(self, after: int | None, limit: int) -> list[tuple[Any, ...]]: ...
    def live_worker_rows(self, live_seconds: float, after: tuple[datetime, uuid.UUID] | None,
                         limit: int) -> list[tuple[Any, ...]]: ...
    def failure_classes(self, since: datetime | None = None) -> list[tuple[Any, ...]]: ...
    def oldest_ready(self) -> list[tuple[Any, ...]]: ...
    # the dashboard's (skiplock.dashboard): bounded by a statement timeout, keyset pages, newest first.
    # ``flt``: {state, queue, task, error_class, since, until, args}, each None for any.
    def find_jobs(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[dict[str, Any]]: ...
    # optional (the read model falls back without them): bounded figures at any table size
    # def queue_summary(self, cap: int) -> dict[str, list[tuple[Any, ...]]]: ...
    # def id_floor(self, before: int | None, window: int) -> int: ...  (``flt["id_floor"]``: ids >= it)
    def matching_job_ids(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[int]: ...
    def throughput(self, seconds: float) -> list[tuple[datetime, int, int, int]]: ...
    def delete_finished_jobs(self, ids: Sequence[int]) -> list[int]: ...
    def audit_write(self, actor: str, action: str, target: Mapping[str, Any], affected: int) -> int: ...
    def audit_rows(self, before: int | None, limit: int) -> list[tuple[Any, ...]]: ...
    def last_tick(self, schedule: str) -> datetime | None: ...


class Backend(ReadBackend, Protocol):
    """Every job operation the rest of skiplock performs. ``conn`` arguments of the lease's verbs are
    the backend's own sessions: a slot's :class:`Lease` (``connect_lease``) or attempt-counting
    :class:`Session` (``connect_bookkeeping``); given one, a verb raises only skiplock errors. Producing
    verbs take the caller's own connection for transactional enqueue."""

    schema: str
    wake_payload: str
    capabilities: Capabilities

    # schema
    def migrate(self) -> list[int]: ...
    def check_schema(self) -> None: ...

    # producing (inside the caller's transaction when ``conn`` is given)
    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]: ...
    def enqueue_unique(self, job: NewJob, unique_key: str, conn: Any = None) -> tuple[int, bool]: ...
    def enqueue_keyed(self, batch: Any, conn: Any = None) -> list[int]: ...

    # connections
    def connect_lease(self, application_name: str) -> Lease: ...
    def connect_bookkeeping(self) -> Session: ...
    def connect_listener(self) -> Notifications: ...
    def connection_budget(self) -> Any: ...  # what the server lets this role open; see ConnectionBudget

    # the transaction lease (inside the slot's transaction)
    def claim(self, conn: Any, queues: Sequence[str] | None, limit: int = 1,
              savepoint: bool = False, tasks: Sequence[str] | None = None) -> list[ClaimedJob]: ...
    def start_attempt(self, conn: Any, job: ClaimedJob, worker: str,
                      lease_pid: int | None, exclusive: bool = True,
                      batch: int | None = None) -> tuple[int, str | None, str | None, bool]: ...
    def mark_exclusive(self, conn: Any, job_id: int, attempt: int) -> None: ...
    def start_batch(self, conn: Any, jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]: ...
    def forget_dead_batches(self, conn: Any, job_id: int, batch: int) -> None: ...
    def complete_batch(self, conn: Any, batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]: ...
    def savepoint(self, conn: Any) -> None: ...
    def rollback_to_savepoint(self, conn: Any) -> None: ...
    def release_savepoint(self, conn: Any) -> None: ...
    def set_local_timeouts(self, conn: Any, seconds: float) -> None: ...
    def complete(self, conn: Any, job: ClaimedJob, attempt: int, result_json: str | None, started_at: datetime,
                 worker: str, owner: uuid.UUID | None = None) -> bool: ...
    def record_outcome(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str, delay: float | None,
                       error: str | None, started_at: datetime, worker: str, uncount: bool = False,
                       owner: uuid.UUID | None = None) -> str | None: ...
    def terminate(self, backend_pids: Sequence[int]) -> None: ...
    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The one finishing write of the worker (see ``Finish``/``Write``): returns {job id: state
        written}; a job missing was refused by its guard (a cancellation requested, the lease fenced
        off) or skipped (its row still locked: its error is kept pending, see ``record_outcome``)."""
        ...

    # the claimed lease
    def start_claimed(self, conn: Any, job: ClaimedJob, owner: uuid.UUID, lease: float,
                      worker: str) -> tuple[int, str | None] | None: ...
    def heartbeat(self, leases: Sequence[tuple[int, uuid.UUID, float]]) -> set[int]: ...
    def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]: ...

    # lifecycle
    def request_cancel(self, job_id: int, reason: str) -> str | None: ...
    def cancel_if_unlocked(self, job_id: int) -> bool: ...
    def cancel_running(self, job_id: int) -> bool: ...
    def end_lease_holder(self, job_id: int) -> bool: ...
    def forget_cancel_request(self, job_id: int) -> None: ...
    def cancel_failed_head(self, job_id: int, reason: str) -> bool:
        """Cancel a failed job that still holds its sequence (rule 'wait'): the sequence goes on.
        False for any other job (and on a backend without sequences)."""
        return False
    def retry_job(self, job_id: int) -> bool: ...
    def unique_key_holder(self, unique_key: str) -> tuple[int, str] | None: ...
    def retry_failed(self, queue: str | None) -> list[tuple[int, str | None, bool, int | None]]: ...
    def queue_known(self, queue: str) -> bool: ...
    def pause_queue(self, queue: str) -> None: ...
    def resume_queue(self, queue: str) -> bool: ...
    def paused_queues(self) -> list[str]: ...
    def add_waiter(self, job_id: int) -> None: ...
    def remove_waiter(self, job_id: int) -> None: ...
    def prune(self, state: str, age_seconds: float, batch: int) -> int | None: ...
    def jobs_vacuum_threshold(self) -> float: ...
    def enqueue_tick(self, schedule: str, tick: datetime, job: NewJob) -> int | None: ...
    def last_tick(self, schedule: str) -> datetime | None: ...

    # reading
    def get_job(self, job_id: int) -> dict[str, Any] | None: ...
    def list_jobs(self, *, state: str | None, queue: str | None, task: str | None, limit: int,
                  before: int | None = None) -> list[dict[str, Any]]: ...
    def counts(self) -> list[tuple[str, str, int]]: ...
    # the workers running now, as each advertises itself (see worker/presence.py)
    def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None, *,
                    host: str | None = None, pid: int | None = None, concurrency: int | None = None) -> None: ...
    def worker_gone(self, worker_id: uuid.UUID) -> None: ...
    def live_workers(self, live_seconds: float) -> int: ...
    def untakeable(self, live_seconds: float) -> list[tuple[str, str, int]]: ...

    def close(self) -> None: ...

    # what the App's producing and pruning call (App is typed against this port, never a backend class)
    dsn: str
    def keyed_batch(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]) -> Any: ...
    def enqueue_steps(self, jobs: Sequence[NewJob]) -> Generator[Any, Any, list[int]]: ...
    def enqueue_unique_steps(self, job: NewJob, unique_key: str) -> Generator[Any, Any, tuple[int, bool]]: ...
    def enqueue_keyed_steps(self, batch: Any) -> Generator[Any, Any, list[int]]: ...
    def run(self, steps: Generator[Any, Any, T], conn: Any = None) -> T: ...  # on conn (its transaction), else pooled
    async def run_async(self, steps: Generator[Any, Any, T], conn: Any) -> T: ...  # on the caller's async connection
    def prune_ticks(self, age_seconds: float) -> None: ...
    def outbox_store(self) -> Any: ...
    def testing(self) -> Any: ...  # what skiplock.testing does on this database (rolled-back connections, ...)  # the outbox's operations on this database (an outbox_base.OutboxStore)


class TraceStore(Protocol):
    """Optional (a backend has it if it defines ``trace_store()``): where the trace context a job was
    enqueued under is kept until a claim takes it (skiplock.observability.tracing). Without it,
    tracing still makes spans, but a job's execute span does not continue its enqueuer's trace."""

    def store(self, ids: Sequence[int], carrier: dict[str, str], conn: Any = None) -> None: ...

    def take(self, lease: "Lease", ids: Sequence[int]) -> dict[int, dict[str, str]]: ...


class TaskLimits(NamedTuple):
    """A task's flow-control limits from its code (``@app.task(concurrency=, rate=, partition_by=)``):
    ``every`` is the seconds between starts of one key (a rate), None for no rate."""

    task: str
    concurrency: int | None
    partition_by: str | None
    every: float | None


class FlowKey(NamedTuple):
    """One limited key of a job claimed by ``claim_flow``: its concurrency ``limit`` (None: only a
    rate), the slot taken (None: none free), how many of its slots exist, and its rate's ``every``."""

    key: str
    limit: int | None
    slot: int | None
    slots_existing: int | None
    every: float | None


class QueueViewBackend(Protocol):
    """``Capabilities.claimable_queues`` (worker/queue_view.py)."""

    def claimable_queues(self, conn: Any, most: int) -> tuple[list[str], list[str]]:
        """In the lease's transaction: (the paused queues, the queues with queued jobs -- read only
        when some queue is paused, else empty; at most ``most`` + 1 of them, paused ones included),
        each in name order."""
        ...


class FlowBackend(Protocol):
    """Flow control's verbs (``Capabilities.flow_control``; docs/flow-control.md). ``claim_flow``
    runs in the lease transaction; ``ensure_slots`` and ``take_starts`` on the bookkeeping session."""

    def claim_flow(self, conn: Any, queues: Sequence[str] | None, tasks: Sequence[str],
                   limits: Sequence[TaskLimits], held_queues: Sequence[str], held_tasks: Sequence[str],
                   held: Sequence[str], fair_queue: str | None = None,
                   after: str | None = None) -> tuple[ClaimedJob, list[FlowKey], str | None] | None: ...
    def claim_flow_many(self, conn: Any, limit: int, queues: Sequence[str] | None, tasks: Sequence[str],
                        limits: Sequence[TaskLimits], held_queues: Sequence[str], held_tasks: Sequence[str],
                        held: Sequence[str]) -> list[tuple[ClaimedJob, list[FlowKey], str | None]]: ...
    def claim_flow_fair_many(self, conn: Any, limit: int, queue: str, after: str | None, tasks: Sequence[str],
                             limits: Sequence[TaskLimits], held_tasks: Sequence[str],
                             held: Sequence[str]) -> list[tuple[ClaimedJob, list[FlowKey], str | None]]: ...
    def ensure_slots(self, conn: Any, keys: Sequence[tuple[str, int]]) -> None: ...
    def release_stale_slots(self) -> int: ...
    def take_starts(self, conn: Any, keys: Sequence[tuple[str, float]]) -> tuple[bool, dict[str, float]]: ...
    def set_queue_limit(self, queue: str, concurrency: int | None, rate: tuple[int, float] | None,
                        fair: bool = False, weights: Mapping[str, int] | None = None) -> None: ...
    def queue_limits(self, retiring: bool = False) -> list[tuple[Any, ...]]: ...
    def retire_queue_limit(self, queue: str, lock_timeout: float = ...) -> bool: ...
    def retiring_queues(self) -> list[str]: ...
    def retire_queue_limits(self) -> list[str]: ...
    def set_task_limit(self, task: str, concurrency: int | None, rate: tuple[int, float] | None,
                       clear: bool = False) -> None: ...
    def task_limits(self) -> list[tuple[Any, ...]]: ...
