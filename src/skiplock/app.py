"""App: configuration, the task registry, enqueueing (also on the caller's connection) and reads."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .backend.base import NewJob
from .backend.postgres import PostgresBackend
from .backend.postgres.backend import DEFAULT_CONNECT_TIMEOUT, KeyedBatch
from .errors import (ConfigurationError, DatabaseUnavailable, DuplicateJob, InvalidJob, JobFailed, JobNotFound,
                     UnknownQueue, UnknownTask, WaitTimeout, redact_dsn)
from .job import Job, JobState
from .retry import MAX_DELAY, RetryPolicy, as_policy, check_delay  # noqa: F401 - MAX_DELAY: public here too
from .values import (MAX_QUEUE_CHARS, MAX_TASK_CHARS, MAX_UNIQUE_KEY_CHARS, _encode_compact,  # noqa: F401 - public here too
                     check_text, to_json)

if TYPE_CHECKING:
    from .backend.postgres.steps import Steps
    from .maintenance.periodic import Schedule
    from .outbox import Outbox, Relay
    from .readmodel import ReadModel
    from .worker import Worker

FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
# How long finished jobs are kept before the pruner deletes them (seconds), by state.
DEFAULT_RETENTION = {"done": 86400.0, "cancelled": 7 * 86400.0, "failed": 30 * 86400.0}

DEFAULT_MAX_ARGS_BYTES = 1 << 20  # 1 MiB of JSON per job
DEFAULT_MAX_RESULT_BYTES = 1 << 20
INT32 = (-(2**31), 2**31 - 1)
# Matches the CHECK on jobs.run_at: every client can read these times back.
RUN_AT_RANGE = (datetime(1900, 1, 1, tzinfo=timezone.utc), datetime(9000, 1, 1, tzinfo=timezone.utc))


@dataclass(frozen=True)
class Task:
    """A registered handler and its defaults. ``handler(job, **job.args)`` runs inside the job's
    transaction (transaction lease): its writes through ``job.conn`` commit with the job's completion."""

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    retry: RetryPolicy = as_policy(None)
    timeout: float | None = None
    lease: str = "transaction"
    lease_seconds: float = 60.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _check_queue(queue: Any) -> str:
    return check_text("queue", queue, MAX_QUEUE_CHARS)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidJob(f"{name} must be an integer between {low} and {high}, got {value!r}")
    return value


def _check_retention(retention: Mapping[str, float | timedelta]) -> dict[str, float]:
    """{state: seconds} for finished states; rejects unknown states and negative ages."""
    out: dict[str, float] = {}
    for state, age in retention.items():
        if state not in ("done", "failed", "cancelled"):
            raise ConfigurationError(f"retention is for finished states (done, failed, cancelled), got {state!r}")
        seconds = age.total_seconds() if isinstance(age, timedelta) else age
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError(f"retention for {state!r} must be a non-negative duration, got {age!r}")
        out[state] = float(seconds)
    return out


# enqueue_many options that _new_jobs' shortcut handles (run_at and delay vary per job: no shortcut)
_PLAIN_OPTIONS = frozenset({"queue", "priority", "max_attempts"})
_ITEM_OPTIONS = frozenset({"queue", "priority", "run_at", "delay", "max_attempts", "unique_key", "on_conflict"})
ON_CONFLICT = ("return", "raise")
_STR_OR_NONE = (str, type(None))
_INT_OR_NONE = (int, type(None))
_only_str = frozenset({str}).issuperset


def _plain_args_json(args: dict[Any, Any], limit: int) -> str | None:
    """Exactly ``serialise_args(args, limit)`` for the common case -- a dict with str keys that
    encodes without error, holds no ``\\u0000`` escape and fits ``limit`` -- at a fraction of the
    cost; None for anything else, which then goes through serialise_args for its verdict."""
    if not args:
        return "{}" if limit >= 2 else None
    if not _only_str(map(type, args)):
        return None
    try:
        text = _encode_compact(args)
    except Exception:  # noqa: BLE001 - serialise_args names the problem
        return None
    if "\\u0000" in text:
        return None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return None
    return text if size <= limit else None


def serialise_args(args: Any, limit: int) -> str:
    """JSON text of a job's keyword arguments (a JSON object with string keys), or InvalidJob."""
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise InvalidJob(f"args must be a JSON object (a dict of keyword arguments), got {type(args).__name__}")
    for key in args:
        if not isinstance(key, str):
            raise InvalidJob(f"args keys must be strings (they become keyword arguments), got {key!r}")
    return to_json(args, "args", limit)


def _check_unique(unique_key: Any, on_conflict: Any) -> str | None:
    """The unique key (None: none), or InvalidJob; ``on_conflict`` is checked even without a key."""
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        raise InvalidJob(f"on_conflict must be 'return' or 'raise', got {on_conflict!r}")
    return check_text("unique_key", unique_key, MAX_UNIQUE_KEY_CHARS, optional=True)


def _enqueue_steps(backend: PostgresBackend, job: NewJob, unique_key: str | None, on_conflict: str) -> "Steps[int]":
    """What :meth:`App.enqueue` sends and decides once its input is checked, as steps that the sync
    driver (App.enqueue) and the async one (AsyncApp.enqueue on an AsyncConnection) both run."""
    if unique_key is None:
        return (yield from backend.enqueue_steps([job]))[0]
    job_id, created = yield from backend.enqueue_unique_steps(job, unique_key)
    if not created and on_conflict == "raise":
        raise DuplicateJob(f"job {job_id} already holds unique_key {unique_key!r}", job_id)
    return job_id


def _check_run_at(run_at: Any) -> datetime | None:
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidJob(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at.tzinfo is None:
        raise InvalidJob("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    try:
        utc = run_at.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not RUN_AT_RANGE[0] < utc < RUN_AT_RANGE[1]:
        raise InvalidJob(f"run_at must be between {RUN_AT_RANGE[0]:%Y} and {RUN_AT_RANGE[1]:%Y} (UTC), got {run_at.isoformat()}")
    return utc


def _check_connect_timeout(value: Any) -> float:
    """``App(connect_timeout=...)``, else ``SKIPLOCK_CONNECT_TIMEOUT``, else the default; a positive
    finite number of seconds, or ConfigurationError saying where the bad value came from."""
    source = "connect_timeout"
    if value is None:
        env = os.environ.get("SKIPLOCK_CONNECT_TIMEOUT", "").strip()
        if not env:
            return DEFAULT_CONNECT_TIMEOUT
        source = "SKIPLOCK_CONNECT_TIMEOUT"
        try:
            value = float(env)
        except ValueError:
            raise ConfigurationError(f"SKIPLOCK_CONNECT_TIMEOUT must be a number of seconds, got {env!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{source} must be a positive number of seconds, got {value!r}")
    return float(value)


# PostgreSQL keeps the first 63 bytes (NAMEDATALEN - 1) of a name and drops the rest without error.
MAX_NAME_BYTES = 63


def check_schema_name(schema: Any) -> str:
    """Any name PostgreSQL accepts as a schema, as it is (quoted as an identifier wherever it is used:
    quotes, spaces, "%" or non-ASCII letters are fine), or ConfigurationError: not a non-empty
    string, a NUL character, or longer than 63 bytes in UTF-8 -- PostgreSQL would truncate it, and
    two long names sharing their first 63 bytes would silently share tables."""
    if not isinstance(schema, str) or not schema:
        raise ConfigurationError(f"schema must be a non-empty name, got {schema!r}")
    if "\x00" in schema:
        raise ConfigurationError(f"schema names cannot contain NUL characters, got {schema!r}")
    try:
        size = len(schema.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"schema {schema!r} is not valid Unicode (a lone surrogate?)") from None
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(f"schema {schema!r} is {size} bytes in UTF-8; PostgreSQL keeps at most "
                                 f"{MAX_NAME_BYTES} bytes of a name (longer ones would be truncated)")
    return schema


class RetriedJobs(list):  # type: ignore[type-arg]  # list[int]
    """What :meth:`App.retry_failed` returns: the ids of the jobs put back (it is that list), and
    ``not_retried``, {job id: :class:`DuplicateJob`} for each failed job that stays failed because its
    unique key is held (``str(error)`` says by which job; ``error.existing_id`` is that job's id)."""

    def __init__(self, ids: Iterable[int] = ()):
        super().__init__(ids)
        self.not_retried: dict[int, DuplicateJob] = {}


def _held_message(job_id: int, unique_key: str | None, holder: int, state: str | None = None) -> str:
    how = f" ({state})" if state else " (queued or running)"
    return (f"job {job_id} cannot be retried: job {holder} holds its unique_key {unique_key!r}{how}; "
            "retry it once that job has finished")


class App:
    """The entry point: ``App(dsn=None)`` uses the embedded PostgreSQL (or ``SKIPLOCK_DSN``).

    Nothing connects until first use, so an App can be created at import time and configured later
    (the CLI's ``--dsn`` does that through :meth:`configure`).

    ``connect_timeout`` (seconds; default ``SKIPLOCK_CONNECT_TIMEOUT``, else 5): the longest a call
    that needs a pooled connection (``enqueue``/``enqueue_many``/``outbox.put`` without ``conn``,
    reads, ...) waits for one before raising :class:`DatabaseUnavailable` -- while the server is down
    or while every pooled connection is in use; also libpq's connect timeout of every connection
    skiplock opens (whole seconds, at least 2).
    """

    def __init__(self, dsn: str | None = None, *, schema: str = "skiplock", data_dir: str | Path | None = None,
                 lease_timeout: float = 600.0, max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                 retention: Mapping[str, float | timedelta] | None = None, connect_timeout: float | None = None):
        self._dsn = dsn
        self.connect_timeout = _check_connect_timeout(connect_timeout)
        self.schema = schema
        self.data_dir = data_dir
        self.lease_timeout = lease_timeout
        self.max_args_bytes = max_args_bytes
        self.max_result_bytes = max_result_bytes
        self.retention = _check_retention(DEFAULT_RETENTION if retention is None else retention)
        self.schedules: dict[str, "Schedule"] = {}
        self.tasks: dict[str, Task] = {}
        self._backend: PostgresBackend | None = None
        self._schema_checked = False
        self.embedded_server: Any = None

    # ---- configuration -----------------------------------------------------------------------

    def configure(self, *, dsn: str | None = None, schema: str | None = None, data_dir: str | Path | None = None) -> "App":
        """Override settings before first use (used by the CLI)."""
        if self._backend is not None:
            raise ConfigurationError("configure() must be called before the app first connects")
        if dsn is not None:
            self._dsn = dsn
        if schema is not None:
            self.schema = schema
        if data_dir is not None:
            self.data_dir = data_dir
        return self

    @property
    def dsn(self) -> str:
        """The DSN in use: the one given, else ``SKIPLOCK_DSN``, else the embedded server's."""
        if self._dsn is None:
            env = os.environ.get("SKIPLOCK_DSN")
            if env:
                self._dsn = env
            else:
                from .embedded import ensure_server

                data_dir = self.data_dir or os.environ.get("SKIPLOCK_DATA_DIR") or None
                self.embedded_server = ensure_server(data_dir)
                self._dsn = self.embedded_server.dsn
        return self._dsn

    @property
    def backend(self) -> PostgresBackend:
        if self._backend is None:
            check_schema_name(self.schema)
            self._backend = PostgresBackend(self.dsn, self.schema, lease_timeout=self.lease_timeout,
                                            connect_timeout=self.connect_timeout)
        return self._backend

    def check(self) -> None:
        """Connect and verify the schema now (clear errors early) instead of at first use."""
        self._ready()

    def _ready(self) -> PostgresBackend:
        backend = self.backend
        if not self._schema_checked:
            backend.check_schema()
            self._schema_checked = True
        return backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
            self._schema_checked = False

    def __repr__(self) -> str:
        """Which database and schema, never the DSN's password (nor does it resolve the DSN)."""
        dsn = "<SKIPLOCK_DSN or the embedded server>" if self._dsn is None else redact_dsn(self._dsn)
        return f"<skiplock.App dsn={dsn!r} schema={self.schema!r} tasks={len(self.tasks)}>"

    def __enter__(self) -> "App":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- tasks -------------------------------------------------------------------------------

    def task(self, name: str | None = None, *, queue: str = "default", priority: int = 0, max_attempts: int = 5,
             retry: RetryPolicy | float | None = None, timeout: float | None = None, lease: str = "transaction",
             lease_seconds: float = 60.0) -> Callable[[Callable[..., Any]], Task]:
        """Register ``fn`` as a task. It is called as ``fn(job, **job.args)`` (``async def`` works too).

        ``lease="transaction"`` (default): the job runs inside its claim transaction; its writes
        through ``job.conn`` commit with its completion (exactly once). ``lease="claimed"``: for long
        jobs -- a short transaction marks it running with an owner and a lease of ``lease_seconds``,
        renewed by heartbeat while the handler runs; an expired lease is rescued back to the queue.
        See docs/leases.md for when to use which.

        ``timeout`` (seconds): past it, the job's transaction is ended by PostgreSQL and the worker
        stops waiting for the handler; the attempt fails with a timeout error and is retried or failed
        by the policy."""
        _check_queue(queue)
        _check_int("priority", priority, *INT32)
        _check_int("max_attempts", max_attempts, 1, INT32[1])
        policy = as_policy(retry)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if lease not in ("transaction", "claimed"):
            raise ConfigurationError(f"lease must be 'transaction' or 'claimed', got {lease!r}")
        if (isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float))
                or not math.isfinite(lease_seconds) or not 1 <= lease_seconds <= 86400):
            raise ConfigurationError(f"lease_seconds must be between 1 and 86400, got {lease_seconds!r}")

        def register(fn: Callable[..., Any]) -> Task:
            task_name = check_text("task name", name or f"{fn.__module__}.{fn.__qualname__}", MAX_TASK_CHARS)
            if task_name in self.tasks and self.tasks[task_name].fn is not fn:
                raise ConfigurationError(f"task {task_name!r} is already registered")
            t = Task(task_name, fn, queue, priority, max_attempts, policy, None if timeout is None else float(timeout),
                     lease, float(lease_seconds))
            self.tasks[task_name] = t
            return t

        return register

    def get_task(self, name: str) -> Task:
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

    # ---- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Install or upgrade the schema; returns the versions applied (empty if up to date)."""
        applied = self.backend.migrate()
        self._schema_checked = True
        return applied

    # ---- producing ---------------------------------------------------------------------------

    def _new_job(self, task: str, args: Any, queue: str | None, priority: int | None, run_at: datetime | None,
                 delay: float | timedelta | None, max_attempts: int | None) -> NewJob:
        check_text("task", task, MAX_TASK_CHARS)
        registered = self.tasks.get(task)
        if delay is not None:
            if run_at is not None:
                raise InvalidJob("give run_at or delay, not both")
            try:
                seconds = check_delay(delay.total_seconds() if isinstance(delay, timedelta) else delay, "delay")
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None
            run_at = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        return NewJob(
            task=task,
            args_json=serialise_args(args, self.max_args_bytes),
            queue=_check_queue(queue if queue is not None else (registered.queue if registered else "default")),
            priority=_check_int("priority", priority if priority is not None else (registered.priority if registered else 0), *INT32),
            max_attempts=_check_int("max_attempts", max_attempts if max_attempts is not None else (registered.max_attempts if registered else 5), 1, INT32[1]),
            run_at=_check_run_at(run_at),
        )

    def enqueue(self, task: str, args: Mapping[str, Any] | None = None, *, queue: str | None = None,
                priority: int | None = None, run_at: datetime | None = None, delay: float | timedelta | None = None,
                max_attempts: int | None = None, unique_key: str | None = None, on_conflict: str = "return",
                conn: Any = None) -> int:
        """Insert one job and return its id. With ``conn`` (a psycopg connection), the insert runs in
        the caller's transaction: the job exists only if the caller commits. Invalid input raises
        :class:`InvalidJob` before anything is sent, so the caller's transaction stays usable.

        ``unique_key``: at most one queued or running job holds a key (a partial unique index, so it
        holds under concurrent enqueuers); enqueueing again returns the holder's id, or raises
        :class:`DuplicateJob` with ``on_conflict="raise"``."""
        job = self._new_job(task, args, queue, priority, run_at, delay, max_attempts)
        unique_key = _check_unique(unique_key, on_conflict)
        backend = self._ready()
        return backend.run(_enqueue_steps(backend, job, unique_key, on_conflict), conn)

    def enqueue_many(self, jobs: Iterable[tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], Mapping[str, Any]]],
                     *, conn: Any = None) -> list[int]:
        """Insert many jobs in one transaction and return their ids, in input order. Each item is
        ``(task, args)`` or ``(task, args, options)`` with options as for :meth:`enqueue` (``queue``,
        ``priority``, ``run_at``, ``delay``, ``max_attempts``, ``unique_key``, ``on_conflict``).

        - Every item is checked before anything is sent: a bad one raises :class:`InvalidJob` naming
          its index, and nothing is written (the caller's transaction stays usable).
        - One transaction: all the jobs exist or none do. With ``conn`` (a psycopg connection) it is
          the caller's transaction -- the jobs exist only if the caller commits; a connection in
          autocommit mode gets a transaction of its own for this call. Workers get one wake-up
          NOTIFY, at commit.
        - ``ids[k]`` is the id of item ``k``. The ids of the jobs a call creates ascend in input order
          (at equal priority an earlier item is claimed first) but need not be contiguous: concurrent
          enqueuers draw from the same sequence.
        - A job without ``run_at``/``delay`` is due at the transaction's start (``now()``).

        Unique keys, per item, as in :meth:`enqueue` (at most one queued or running job holds a key):

        - An item whose key a queued or running job holds creates nothing; its id is the holder's
          (older, so out of the ascending order) -- the job that held the key when this call's insert
          ran. Like any id, that job may finish at any moment after; it may even have finished by the
          time the call returns, and then the key is free again (enqueue again for a new job).
        - Items of one call sharing a key: the first creates (or finds) the job, a later one gets the
          same id. A later one with ``on_conflict="raise"`` is refused before anything is sent
          (:class:`DuplicateJob` naming both items, ``existing_id`` None).
        - ``on_conflict="raise"`` on an item whose key is held: :class:`DuplicateJob` naming the first
          such item, its key and the holder (``existing_id``), and nothing is enqueued -- the call's
          insert is undone (a savepoint in the caller's transaction, which stays usable).
        - A batch with any key is one INSERT, whatever its size (no COPY), plus, only if a holder
          committed while the insert waited for it, one lookup; concurrent batches sharing keys wait
          for each other (never deadlock) and create one job per key between them.

        Fewer than 1,000 jobs (``backend.postgres.backend.COPY_MIN_JOBS``) go in one INSERT statement;
        larger batches are streamed with COPY after one statement has reserved their ids (2-3 times
        the rows per second; not on a connection in pipeline mode or with a non-UTF-8 client
        encoding, which get the INSERT)."""
        new, keyed = self._new_jobs(jobs)
        if not new:
            return []
        if not keyed:
            return self._ready().enqueue(new, conn)
        batch = KeyedBatch(new, keyed)  # in-call duplicates with on_conflict="raise": refused before any I/O
        return self._ready().enqueue_keyed(batch, conn)

    def _new_jobs(self, jobs: Iterable[Any]) -> tuple[list[NewJob], dict[int, tuple[str, str]]]:
        """Check ``enqueue_many`` items: the jobs to insert and ``{item index: (unique_key,
        on_conflict)}`` for the items with a key, or InvalidJob naming the first bad item.

        :meth:`_new_job` is the one definition of a valid job; this only avoids repeating its work.
        An item ``(task, args)`` or ``(task, args, {queue/priority/max_attempts})`` with a plain dict
        of args takes a shortcut once an item of the same task and options (same values, same exact
        types) has been through _new_job in this call: the checked queue, priority and max_attempts
        are reused, and :func:`_plain_args_json` encodes the args (deferring to serialise_args for
        anything unusual). Same jobs, same errors, 2-4 times less Python per item."""
        new: list[NewJob] = []
        keyed: dict[int, tuple[str, str]] = {}
        append = new.append
        limit = self.max_args_bytes
        checked: dict[tuple[str, str | None, int | None, int | None], tuple[str, int, int]] = {}
        for i, item in enumerate(jobs):
            key = None
            if type(item) is tuple:
                if len(item) == 2:
                    task, args = item
                    if type(task) is str:
                        key = (task, None, None, None)
                elif len(item) == 3 and type(item[2]) is dict and item[2].keys() <= _PLAIN_OPTIONS:
                    task, args, options = item
                    queue, priority, attempts = options.get("queue"), options.get("priority"), options.get("max_attempts")
                    # exact types only: True == 1 and 1.0 == 1 as dict keys, but neither is a valid priority
                    if type(task) is str and type(queue) in _STR_OR_NONE and type(priority) in _INT_OR_NONE \
                            and type(attempts) in _INT_OR_NONE:
                        key = (task, queue, priority, attempts)
                if key is not None and type(args) is dict:
                    known = checked.get(key)
                    if known is not None:
                        text = _plain_args_json(args, limit)
                        if text is not None:
                            append(NewJob(task, text, known[0], known[1], known[2], None))
                            continue
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise InvalidJob(f"item {i}: expected (task, args) or (task, args, options), got {item!r}")
            options = dict(item[2]) if len(item) == 3 else {}
            unknown = set(options) - _ITEM_OPTIONS
            if unknown:
                raise InvalidJob(f"item {i}: unknown options {sorted(unknown)}")
            try:
                job = self._new_job(item[0], item[1], options.get("queue"), options.get("priority"),
                                    options.get("run_at"), options.get("delay"), options.get("max_attempts"))
                on_conflict = options.get("on_conflict", "return")
                unique_key = _check_unique(options.get("unique_key"), on_conflict)
            except InvalidJob as exc:
                raise InvalidJob(f"item {i}: {exc}") from None
            append(job)
            if unique_key is not None:
                keyed[i] = (unique_key, on_conflict)
            if key is not None:
                checked[key] = (job.queue, job.priority, job.max_attempts)
        return new, keyed

    # ---- reading -----------------------------------------------------------------------------

    @staticmethod
    def _job(row: Mapping[str, Any]) -> Job:
        data = dict(row)
        data["state"] = JobState(data["state"])
        return Job(**data)

    def get_job(self, job_id: int) -> Job:
        """The job as stored, except that a transaction-lease job in flight (its row says ``queued``
        while its lease transaction runs the handler) is shown ``running``, with its attempt, slot
        (``worker``) and start (``started_at``); see :mod:`skiplock.readmodel` for exactly when."""
        row = self._ready().get_job(job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        return self._job(row)

    def list_jobs(self, *, state: str | None = None, queue: str | None = None, task: str | None = None,
                  limit: int = 50, before: int | None = None) -> list[Job]:
        """Jobs newest first, at most ``limit``; the next page: ``before=`` the last id of this one
        (keyset pagination: a job enqueued or deleted meanwhile never makes a page repeat or skip a
        row). States as :meth:`get_job` shows them: ``state="running"`` lists every job in flight,
        whichever its lease (see :mod:`skiplock.readmodel`), and ``"queued"`` leaves them out."""
        if state is not None:
            try:
                state = JobState(state).value
            except ValueError:
                raise InvalidJob(f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}") from None
        check_text("queue", queue, MAX_QUEUE_CHARS, optional=True)  # a filter no job can match is a mistake
        check_text("task", task, MAX_TASK_CHARS, optional=True)
        _check_int("limit", limit, 1, 100_000)
        if before is not None:
            _check_int("before", before, 1, 2**63 - 1)
        return [self._job(r) for r in self._ready().list_jobs(state=state, queue=queue, task=task, limit=limit,
                                                              before=before)]

    def counts(self) -> list[tuple[str, str, int]]:
        """(queue, state, count) for every queue and state that has jobs; a transaction-lease job in
        flight counts as ``running`` (see :mod:`skiplock.readmodel`)."""
        return self._ready().counts()

    @property
    def read_model(self) -> "ReadModel":
        """What is running, who runs it, what failed, what waits: :class:`skiplock.readmodel.ReadModel`."""
        from .readmodel import ReadModel

        return ReadModel(self._ready())

    def live_workers(self) -> int:
        """How many workers are running: seen in the last ``presence.LIVE_SECONDS`` seconds."""
        from .worker.presence import LIVE_SECONDS

        return self._ready().live_workers(LIVE_SECONDS)

    def untakeable_jobs(self) -> list[tuple[str, str, int]]:
        """(queue, task, count) of queued jobs that no running worker can take: no worker seen in the
        last ``presence.LIVE_SECONDS`` seconds has the task registered and serves the queue. (A worker
        claims only its own tasks; these jobs wait, untouched, for one that knows them.)"""
        from .worker.presence import LIVE_SECONDS

        return self._ready().untakeable(LIVE_SECONDS)

    # ---- lifecycle -----------------------------------------------------------------------------

    def cancel_job(self, job_id: int, reason: str = "cancelled by request", wait: float = 10.0) -> JobState:
        """Cancel a job and return its state. A queued job is cancelled at once and never runs. A
        job running in a transaction lease is told by ending its session: its transaction rolls back
        (its database effects vanish) and it ends ``cancelled``. A job that already finished keeps
        its state (returned). If the running handler does not let go within ``wait`` seconds, the
        request stays recorded and the job ends cancelled as soon as it does; a finishing ``done``
        write never overwrites a cancellation."""
        check_text("reason", reason, 10_000)
        backend = self._ready()
        state = backend.request_cancel(job_id, reason)
        if state is None:
            raise JobNotFound(f"no job with id {job_id}")
        deadline = time.monotonic() + wait
        while True:
            if backend.cancel_if_unlocked(job_id) or backend.cancel_running(job_id):
                return JobState.CANCELLED
            current = self.get_job(job_id).state
            if current in FINISHED:
                if current != JobState.CANCELLED:
                    backend.forget_cancel_request(job_id)
                return current
            backend.end_lease_holder(job_id)
            if time.monotonic() > deadline:
                return current
            time.sleep(0.02)

    def retry_job(self, job_id: int) -> None:
        """Put a failed (or cancelled) job back in the queue with fresh attempts; its errors are kept.
        Raises JobNotFound, InvalidJob (the job is not failed or cancelled) or :class:`DuplicateJob`
        (``existing_id``: the queued or running job that holds its unique key now; retry it once that
        job has finished)."""
        backend = self._ready()
        for _ in range(10):  # the holder may finish between the refusal and the lookup: try again
            if backend.retry_job(job_id):
                return
            job = self.get_job(job_id)  # JobNotFound if it does not exist
            if job.state not in (JobState.FAILED, JobState.CANCELLED):
                raise InvalidJob(f"job {job_id} is {job.state}; only failed or cancelled jobs can be retried")
            holder = backend.unique_key_holder(job.unique_key) if job.unique_key is not None else None
            if holder is not None:
                raise DuplicateJob(_held_message(job_id, job.unique_key, *holder), holder[0])
        raise DatabaseUnavailable(f"the unique key of job {job_id} kept changing hands; try again")

    def retry_failed(self, queue: str | None = None) -> "RetriedJobs":
        """Put every failed job (of ``queue``) back, in one statement; returns the ids retried (a
        list, in id order). A job whose unique key is held -- by a queued or running job, or by an
        earlier failed job with the same key retried here -- stays failed, and is in the result's
        ``not_retried``: {job id: :class:`DuplicateJob` saying why, ``existing_id`` the holder}."""
        retried = RetriedJobs()
        for job_id, unique_key, ok, holder in self._ready().retry_failed(queue):
            if ok:
                retried.append(job_id)
            elif holder is not None:
                retried.not_retried[job_id] = DuplicateJob(_held_message(job_id, unique_key, holder), holder)
            else:  # retried by someone else meanwhile
                retried.not_retried[job_id] = DuplicateJob(f"job {job_id} is no longer failed", None)
        return retried

    def pause_queue(self, queue: str, *, force: bool = False) -> None:
        """Stop workers claiming from ``queue`` (they honour it at their next claim, no restart).
        Jobs already running finish. Unknown queues are refused unless ``force``."""
        _check_queue(queue)
        backend = self._ready()
        if not force and not backend.queue_known(queue) and queue not in {t.queue for t in self.tasks.values()}:
            raise UnknownQueue(f"unknown queue {queue!r}: no job has used it (use force=True / --force to pause it "
                               "before it is used)")
        backend.pause_queue(queue)

    def resume_queue(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again; False if it was not paused."""
        return self._ready().resume_queue(_check_queue(queue))

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with jobs or paused: ``{"queue", "paused", "counts": {state: n}}``."""
        backend = self._ready()
        paused = set(backend.paused_queues())
        out: dict[str, dict[str, Any]] = {q: {"queue": q, "paused": True, "counts": {}} for q in paused}
        for queue, state, n in backend.counts():
            out.setdefault(queue, {"queue": queue, "paused": queue in paused, "counts": {}})["counts"][state] = n
        return [out[q] for q in sorted(out)]

    def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Block until the job finishes; return its result, or raise :class:`JobFailed` (failed or
        cancelled) or :class:`WaitTimeout`. Woken by LISTEN/NOTIFY on the fixed channel ``skiplock``
        (the finishing write notifies only jobs someone waits on), with a 1 s re-check as fallback."""
        backend = self._ready()
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = backend.connect_listener()
        try:
            backend.add_waiter(job_id)
            while True:
                job = self.get_job(job_id)
                if job.state == JobState.DONE:
                    return job.result
                if job.state in FINISHED:
                    first_line = (job.last_error or "").splitlines()[0] if job.last_error else ""
                    raise JobFailed(f"job {job_id} ended {job.state}: {first_line}", job)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeout(f"job {job_id} did not finish within {timeout}s (it is {job.state})")
                wait_for = 1.0 if remaining is None else min(1.0, remaining)
                for _ in listener.notifies(timeout=wait_for, stop_after=1):
                    pass
        finally:
            try:
                backend.remove_waiter(job_id)
            finally:
                listener.close()

    def prune(self, retention: Mapping[str, float | timedelta] | None = None, batch: int = 1000) -> dict[str, int]:
        """Delete finished jobs older than their state's retention, in small batches that never lock
        the queue (SKIP LOCKED) and one process at a time (an advisory lock). Returns counts deleted;
        a state is absent if another process was pruning.

        This deletes everything due at once (``skiplock prune``, a manual call); the worker's
        background pruner paces itself instead (:class:`skiplock.maintenance.pruner.Pruner`)."""
        ages = self.retention if retention is None else _check_retention(retention)
        return self._prune(ages, batch)

    def _prune(self, ages: Mapping[str, float], batch: int, limit: int | None = None,
               ticks: bool = True) -> dict[str, int]:
        """One prune: each state in turn, batch by batch, until a batch comes back short or (with
        ``limit``) that many rows in all were deleted; a state the limit left unvisited is absent,
        as is one another process was pruning. ``ticks``: also prune old periodic ticks and the
        rows of dead batches."""
        backend = self._ready()
        deleted: dict[str, int] = {}
        left = limit
        for state, age in ages.items():
            total = 0
            while left is None or left > 0:
                size = batch if left is None else min(batch, left)
                n = backend.prune(state, age, size)
                if n is None:  # another process is pruning
                    break
                total += n
                if left is not None:
                    left -= n
                if n < size or left == 0:
                    deleted[state] = total
                    break
        if ticks:
            backend.prune_ticks(max(ages.values(), default=86400.0) + 86400.0)
        return deleted

    # ---- periodic ------------------------------------------------------------------------------

    def periodic(self, cron: str, *, name: str | None = None, args: Mapping[str, Any] | None = None,
                 timezone: str = "UTC", missed: str = "skip", queue: str = "default", priority: int = 0,
                 max_attempts: int = 5, retry: RetryPolicy | float | None = None, timeout: float | None = None,
                 lease: str = "transaction", lease_seconds: float = 60.0) -> Callable[[Callable[..., Any]], Task]:
        """Register a task run on a cron schedule (standard 5-field syntax, in ``timezone``). Each tick
        is enqueued exactly once however many workers run schedulers (a unique row per schedule and
        tick). ``missed``: "skip" (default) ignores ticks that passed while no worker ran; "run_once"
        enqueues one job for the latest missed tick when a scheduler starts.

        The task options are :meth:`task`'s, ``lease`` and ``lease_seconds`` included: a long periodic
        job (a nightly export) should take ``lease="claimed"`` so it holds no transaction while it
        runs. Every option is checked here, at decoration time."""
        from .maintenance.periodic import Schedule

        schedule_args = serialise_args(args, self.max_args_bytes)
        Schedule.create("check", cron, schedule_args, timezone, missed)  # clear errors at decoration time
        register_task = self.task(name, queue=queue, priority=priority, max_attempts=max_attempts, retry=retry,
                                  timeout=timeout, lease=lease, lease_seconds=lease_seconds)

        def register(fn: Callable[..., Any]) -> Task:
            task = register_task(fn)
            self.schedules[task.name] = Schedule.create(task.name, cron, schedule_args, timezone, missed)
            return task

        return register

    # ---- working -----------------------------------------------------------------------------

    def worker(self, queues: Sequence[str] | None = None, concurrency: int = 4, **options: Any) -> "Worker":
        """A worker serving ``queues`` (all queues if None) with ``concurrency`` slots."""
        from .worker import Worker

        return Worker(self, queues=queues, concurrency=concurrency, **options)

    # ---- outbox (docs/outbox.md) -------------------------------------------------------------

    @property
    def outbox(self) -> "Outbox":
        """The transactional outbox: ``app.outbox.put(topic, payload, conn=your_conn)``."""
        if getattr(self, "_outbox", None) is None:
            from .outbox import Outbox

            self._outbox = Outbox(self)
        return self._outbox

    def relay(self, sink: Any, **options: Any) -> "Relay":
        """A relay delivering this app's outbox messages through ``sink`` (options: see Relay)."""
        from .outbox import Relay

        return Relay(self, sink, **options)
