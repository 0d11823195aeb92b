"""App: configuration, the task registry, schema, enqueueing, periodic tasks, workers and the outbox.

A registered task (:class:`skiplock.tasks.Task`) and the checks of its options are in tasks.py.
The checks behind ``enqueue``/``enqueue_many`` are :class:`skiplock.producing.Producer`'s, the reads
and operations on jobs and queues :class:`skiplock.operations.Operations`'s (both mixed into App;
the names other code imported from here are re-exported).
The backend comes from :func:`skiplock.backend.open_backend` (the DSN's scheme picks it); App is
typed against the :class:`~skiplock.backend.base.Backend` port, never a backend class."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .backend.base import Backend
from .backend.factory import embedded_server as start_embedded_server, open_backend
from .errors import ConfigurationError, UnknownTask, redact_dsn
from .flow import NOT_SUPPORTED
from .observability.hooks import Hooks
from .observability.reporting import enqueued
from .operations import FINISHED, Operations, RetriedJobs, _held_message  # noqa: F401 - public here too
from .producing import (INT32, ON_CONFLICT, RUN_AT_RANGE, Producer, _check_int, _check_queue,  # noqa: F401
                        _check_run_at, _check_unique, _enqueue_steps, _plain_args_json, serialise_args)
from .retry import MAX_DELAY, RetryPolicy, as_policy  # noqa: F401 - MAX_DELAY: public here too
from .tasks import Task, task_options  # noqa: F401 - Task: public here too (defined in tasks.py)
from .settings import (DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_ARGS_BYTES, DEFAULT_MAX_RESULT_BYTES,  # noqa: F401
                       DEFAULT_RETENTION, MAX_NAME_BYTES, _check_connect_timeout, _check_retention, check_schema_name)
from .values import (MAX_QUEUE_CHARS, MAX_TASK_CHARS, MAX_UNIQUE_KEY_CHARS, _encode_compact,  # noqa: F401 - public here too
                     check_text, to_json)

if TYPE_CHECKING:
    from .maintenance.periodic import Schedule
    from .outbox import Outbox, Relay
    from .worker import Worker


class App(Producer, Operations):
    """The entry point: ``App(dsn=None)`` uses the embedded PostgreSQL (or ``SKIPLOCK_DSN``).

    Nothing connects until first use, so an App can be created at import time and configured later
    (the CLI's ``--dsn`` does that through :meth:`configure`).

    ``connect_timeout`` (seconds; default ``SKIPLOCK_CONNECT_TIMEOUT``, else 5): the longest a call
    that needs a pooled connection (``enqueue``/``enqueue_many``/``outbox.put`` without ``conn``,
    reads, ...) waits for one before raising :class:`DatabaseUnavailable` -- while the server is down
    or while every pooled connection is in use; also libpq's connect timeout of every connection
    skiplock opens (whole seconds, at least 2).

    ``direct_dsn`` (default ``SKIPLOCK_DIRECT_DSN``): a DSN of the PostgreSQL server itself, when ``dsn``
    goes through a transaction-pooling connection pooler (PgBouncer): LISTEN uses it; without it, idle
    workers poll (docs/deployment.md, "PgBouncer and poolers"). Never shown with its password.
    """

    def __init__(self, dsn: str | None = None, *, schema: str = "skiplock", data_dir: str | Path | None = None,
                 lease_timeout: float = 600.0, max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                 retention: Mapping[str, float | timedelta] | None = None, connect_timeout: float | None = None,
                 direct_dsn: str | None = None):
        self._dsn = dsn
        self.direct_dsn = direct_dsn
        self.connect_timeout = _check_connect_timeout(connect_timeout)
        self.schema = schema
        self.data_dir = data_dir
        self.lease_timeout = lease_timeout
        self.max_args_bytes = max_args_bytes
        self.max_result_bytes = max_result_bytes
        self.retention = _check_retention(DEFAULT_RETENTION if retention is None else retention)
        self.schedules: dict[str, "Schedule"] = {}
        self.tasks: dict[str, Task] = {}
        self._backend: Backend | None = None
        self._schema_checked = False
        self.embedded_server: Any = None
        self.hooks = Hooks()  # app.on(event, fn): skiplock.observability.hooks
        self.metrics: Any = None  # app.enable_metrics(): skiplock.observability.metrics.Metrics
        self.tracing: Any = None  # app.enable_tracing(): skiplock.observability.tracing.Tracing

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
                data_dir = self.data_dir or os.environ.get("SKIPLOCK_DATA_DIR") or None
                self.embedded_server = start_embedded_server(data_dir)  # PostgreSQL, skiplock's own
                self._dsn = self.embedded_server.dsn
        return self._dsn

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            check_schema_name(self.schema)
            self._backend = open_backend(self.dsn, self.schema, lease_timeout=self.lease_timeout,
                                         connect_timeout=self.connect_timeout,
                                         direct_dsn=self.direct_dsn or os.environ.get("SKIPLOCK_DIRECT_DSN") or None)
        return self._backend

    def check(self) -> None:
        """Connect and verify the schema now (clear errors early) instead of at first use."""
        self._ready()

    def _ready(self) -> Backend:
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
             lease_seconds: float = 60.0, concurrency: int | None = None, rate: str | None = None,
             partition_by: str | None = None, sequence_by: str | None = None,
             sequence_on_failure: str = "wait") -> Callable[[Callable[..., Any]], Task]:
        """Register ``fn`` as a task. It is called as ``fn(job, **job.args)`` (``async def`` works too).

        ``lease="transaction"`` (default): the job runs inside its claim transaction; its writes
        through ``job.conn`` commit with its completion (exactly once). ``lease="claimed"``: for long
        jobs -- a short transaction marks it running with an owner and a lease of ``lease_seconds``,
        renewed by heartbeat while the handler runs; an expired lease is rescued back to the queue.
        See docs/leases.md for when to use which.

        ``timeout`` (seconds): past it, the job's transaction is ended by PostgreSQL and the worker
        stops waiting for the handler; the attempt fails with a timeout error and is retried or failed
        by the policy.

        Flow control (docs/flow-control.md; PostgreSQL only): ``concurrency=N``: at most N jobs of
        this task run at once across every worker process and host; ``rate="100/min"``: at most that
        many starts per period, evenly spaced; ``partition_by="customer"``: both apply per value of
        that job argument (or per ``partition=`` given at enqueue) instead of to the whole task.

        Sequences (PostgreSQL only): ``sequence_by="account"``: jobs with the same value of that
        argument (or the same ``sequence=`` given at enqueue) run one at a time, in enqueue order,
        across every worker; ``sequence_on_failure``: what a job that failed for good does to the
        rest of its sequence -- ``"wait"`` (default: they wait until it is retried or cancelled),
        ``"skip"`` (they go on) or ``"fail"`` (they fail too, saying why)."""
        options = task_options(queue=queue, priority=priority, max_attempts=max_attempts, retry=retry, timeout=timeout,
                               lease=lease, lease_seconds=lease_seconds, concurrency=concurrency, rate=rate,
                               partition_by=partition_by, sequence_by=sequence_by,
                               sequence_on_failure=sequence_on_failure)  # every option checked here, at decoration time

        def register(fn: Callable[..., Any]) -> Task:
            task_name = check_text("task name", name or f"{fn.__module__}.{fn.__qualname__}", MAX_TASK_CHARS)
            if task_name in self.tasks and self.tasks[task_name].fn is not fn:
                raise ConfigurationError(f"task {task_name!r} is already registered")
            t = Task(task_name, fn, **options)
            self.tasks[task_name] = t
            return t

        return register

    def _check_flow_control(self, what: str) -> None:
        """ConfigurationError if this App's backend has no flow control (MySQL/MariaDB today)."""
        if not self.backend.capabilities.flow_control:
            raise ConfigurationError(f"{what} {NOT_SUPPORTED}")

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


    # ---- observability (docs/observability.md) ---------------------------------------------------

    def on(self, event: str, fn: Callable[..., Any] | None = None) -> Any:
        """Register a hook: ``app.on("success", fn)``, or ``@app.on("failure")`` as a decorator. It is
        called with a :class:`skiplock.observability.JobEvent`, after the fact, on a thread of its own:
        it cannot break or slow a job's transaction, and one that raises is logged once and ignored.
        Events: enqueue, start, success, failure, dead, cancel, lease_lost (see
        :mod:`skiplock.observability.hooks`)."""
        return self.hooks.on(event, fn)

    def enable_metrics(self, registry: Any = None) -> Any:
        """Collect Prometheus metrics for this App (needs ``pip install 'skiplock[metrics]'``) in its own
        ``CollectorRegistry`` (or ``registry``); returns the :class:`skiplock.observability.metrics.Metrics`
        (``app.metrics``). Serve them with ``skiplock.observability.metrics.metrics_asgi_app(app)`` or
        ``skiplock worker --metrics-port``. Idempotent."""
        if self.metrics is None:
            from .observability.metrics import Metrics

            self.metrics = Metrics(self, registry)
        return self.metrics

    def enable_tracing(self, tracer_provider: Any = None) -> Any:
        """Make OpenTelemetry spans for enqueue, claim and execute, the job carrying its enqueuer's trace
        context to its handler (needs ``pip install 'skiplock[otel]'``; the global tracer provider, or
        ``tracer_provider``). Returns the :class:`skiplock.observability.tracing.Tracing`. Idempotent."""
        if self.tracing is None:
            from .observability.tracing import Tracing

            self.tracing = Tracing(self, tracer_provider)
        return self.tracing

    # ---- producing (the checks: skiplock.producing) ---------------------------------------------

    def enqueue(self, task: str, args: Mapping[str, Any] | None = None, *, queue: str | None = None,
                priority: int | None = None, run_at: datetime | None = None, delay: float | timedelta | None = None,
                max_attempts: int | None = None, unique_key: str | None = None, on_conflict: str = "return",
                conn: Any = None, partition: str | None = None, sequence: str | None = None) -> int:
        """Insert one job and return its id. With ``conn`` (a psycopg connection), the insert runs in
        the caller's transaction: the job exists only if the caller commits. Invalid input raises
        :class:`InvalidJob` before anything is sent, so the caller's transaction stays usable.

        ``unique_key``: at most one queued or running job holds a key (a partial unique index, so it
        holds under concurrent enqueuers); enqueueing again returns the holder's id, or raises
        :class:`DuplicateJob` with ``on_conflict="raise"``.

        ``partition``: the job's partition for flow control (docs/flow-control.md): its task's
        limits apply per partition.

        ``sequence``: the job's sequence key (docs/flow-control.md, "Sequences"; wins over the task's
        ``sequence_by``): jobs with the same key run one at a time, in enqueue order. Not with
        ``unique_key``."""
        job = self._new_job(task, args, queue, priority, run_at, delay, max_attempts, partition, sequence)
        unique_key = _check_unique(unique_key, on_conflict, job)
        backend = self._ready()
        if partition is not None:
            self._check_flow_control("a job's partition")
        if job.sequence is not None:
            self._check_flow_control("a job's sequence")
        if self.tracing is None:
            job_id = backend.run(_enqueue_steps(backend, job, unique_key, on_conflict), conn)
        else:  # the enqueue span, and its context kept with the job (observability/tracing.py)
            with self.tracing.enqueue(job.task, job.queue, 1) as keep:
                job_id = backend.run(_enqueue_steps(backend, job, unique_key, on_conflict), conn)
                keep([job_id], conn)
        if self.metrics is not None or self.hooks.active:
            enqueued(self, [job], [job_id])
        return job_id

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
          (at equal priority and ``run_at`` an earlier item is claimed first) but need not be contiguous: concurrent
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

        Fewer than 1,000 jobs (``backend.postgres.producing.COPY_MIN_JOBS``) go in one INSERT statement;
        larger batches are streamed with COPY after one statement has reserved their ids (2-3 times
        the rows per second; not on a connection in pipeline mode or with a non-UTF-8 client
        encoding, which get the INSERT)."""
        new, keyed = self._new_jobs(jobs)
        if not new:
            return []
        if any(j.partition is not None for j in new):
            self._check_flow_control("a job's partition")
        if any(j.sequence is not None for j in new):
            self._check_flow_control("a job's sequence")
        if self.tracing is not None:  # the enqueue span, and its context kept with the jobs
            with self.tracing.enqueue(new[0].task, new[0].queue, len(new)) as keep:
                ids = self._insert_many(new, keyed, conn)
                keep(ids, conn)
        else:
            ids = self._insert_many(new, keyed, conn)
        if self.metrics is not None or self.hooks.active:
            enqueued(self, new, ids)
        return ids

    def _insert_many(self, new: list[Any], keyed: dict[int, tuple[str, str]], conn: Any) -> list[int]:
        if not keyed:
            return self._ready().enqueue(new, conn)
        batch = self.backend.keyed_batch(new, keyed)  # in-call duplicates with on_conflict="raise": refused before any I/O
        return self._ready().enqueue_keyed(batch, conn)

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
