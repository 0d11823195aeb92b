"""PostgreSQL implementation of the backend seam (psycopg 3 + psycopg_pool).

Two kinds of connection:
- a small autocommit pool for short operations (enqueue, reads, attempt counting, migrations);
- one dedicated connection per worker slot whose transaction is the job's lease. It carries session
  bounds so a paused, hung or partitioned worker cannot hold a job forever: the server ends a lease
  transaction idle (or, on PostgreSQL 17+, open) longer than ``lease_timeout``, probes the client
  with TCP keepalives and ``client_connection_check_interval``, and drops it after
  ``tcp_user_timeout`` of unacknowledged data. Any of these rolls the job back to the queue.

Connecting is bounded by ``connect_timeout`` (``App(connect_timeout=...)``, default
DEFAULT_CONNECT_TIMEOUT seconds): the longest an operation on the pool (an ``enqueue`` without the
caller's connection, say) waits for a connection before it raises DatabaseUnavailable -- while the
server is down, or while every pooled connection is in use -- and libpq's ``connect_timeout`` of every
connection skiplock opens (whole seconds, at least 2; a DSN's own ``connect_timeout`` wins there).
"""

from __future__ import annotations

import functools
import math
import select
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Mapping, Sequence

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import DatabaseUnavailable, DuplicateJob, SchemaError, redact, redact_dsn
from ...reconnect import quiet_driver_noise
from ..base import Capabilities, ClaimedJob, Finish, Lease, NewJob, Via
from .errors import CONNECTION_LOST, SESSION_ENDED, connection_lost, one_line, session_gone, translate  # noqa: F401 - kept importable here
from .lease import PostgresLease, PostgresSession
from .notifications import PostgresNotifications
from .queries import load_migrations, load_queries
from .reads import PostgresReads
from .steps import Steps, T, Undoable, run, run_async

DEFAULT_CONNECT_TIMEOUT = 5.0
CONNECT_TIMEOUT = 10  # the libpq connect_timeout of code that passes no timeout (kept for callers)
# A batch of at least this many jobs is inserted with COPY instead of one INSERT … unnest statement:
# below it the extra round trip costs more than COPY saves (bench: see PostgresBackend._copy_jobs).
COPY_MIN_JOBS = 1000
# Client-side formats of the COPY columns (text format; args is JSON text the server parses as jsonb).
COPY_TYPES = ("int8", "text", "text", "text", "int4", "int4", "timestamptz")
# libpq-side TCP settings (ignored on Unix sockets).
CLIENT_TCP = dict(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3, tcp_user_timeout=30000)


# Every session skiplock opens runs its transactions at READ COMMITTED, whatever the database's or
# role's default_transaction_isolation: the claim protocol (FOR UPDATE SKIP LOCKED, guarded writes
# that re-check the row's state) relies on it; at REPEATABLE READ or SERIALIZABLE a claim or a
# finishing write would fail with serialization errors wherever rows changed under the snapshot.
READ_COMMITTED = r"-c default_transaction_isolation=read\ committed"


def session_options(dsn: str, *settings: str) -> str:
    """The ``options`` startup parameter for a skiplock session: the DSN's own options, then
    READ COMMITTED and ``settings`` (later ones win)."""
    try:
        given = str(pg_conninfo.conninfo_to_dict(dsn).get("options") or "")
    except psycopg.ProgrammingError:
        given = ""
    return " ".join(x for x in (given, READ_COMMITTED, *settings) if x)


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages (see :func:`skiplock.errors.redact_dsn`)."""
    return redact_dsn(dsn)


def with_connect_timeout(dsn: str, seconds: float | None = None) -> dict[str, Any]:
    """A bounded connect wait (``seconds``, rounded up to libpq's whole seconds, at least 2; default
    CONNECT_TIMEOUT), unless the DSN sets its own."""
    try:
        given = pg_conninfo.conninfo_to_dict(dsn).get("connect_timeout")
    except psycopg.ProgrammingError:
        given = None
    if given:
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT if seconds is None else max(2, math.ceil(seconds))}


def connect(dsn: str, timeout: float | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
    """psycopg.connect with a bounded wait (see :func:`with_connect_timeout`) and a clear error
    naming the server -- never its password (libpq's own message may quote the DSN: it is redacted too)."""
    try:
        return psycopg.connect(dsn, **with_connect_timeout(dsn, timeout), **kwargs)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(f"invalid DSN ({redact_dsn(dsn)}): {redact(one_line(exc), dsn)}") from None
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): "
                                  f"{redact(one_line(exc), dsn)}") from None


@dataclass(frozen=True)
class ConnectionBudget:
    """What the server allows this role on this database now (see ``connection_budget`` in
    queries.sql): each applicable limit with the sessions counted against it."""

    max_connections: int
    reserved: int  # superuser_reserved_connections + reserved_connections
    in_use: int
    role_limit: int  # -1: none (or a superuser)
    role_in_use: int
    db_limit: int
    db_in_use: int
    role: str
    database: str

    def available(self) -> tuple[int, str]:
        """(sessions that can still be opened, the limit that decides it, in words)."""
        limits = [(self.max_connections - self.reserved - self.in_use,
                   f"server max_connections {self.max_connections} less {self.reserved} reserved, {self.in_use} in use")]
        if self.role_limit >= 0:
            limits.append((self.role_limit - self.role_in_use,
                           f"role {self.role!r} CONNECTION LIMIT {self.role_limit}, {self.role_in_use} in use"))
        if self.db_limit >= 0:
            limits.append((self.db_limit - self.db_in_use,
                           f"database {self.database!r} CONNECTION LIMIT {self.db_limit}, {self.db_in_use} in use"))
        free, why = min(limits)
        return max(0, free), why


# A keyed batch whose holders keep finishing between its insert and its lookup is tried this many
# times (as `enqueue_unique` tries its one key) before giving up.
KEYED_ATTEMPTS = 10


class HolderGone(Exception):
    """A key's holder finished before the batch could read its id: undo the attempt and run it again."""


def _not_async(conn: Any) -> None:
    """The sync calls take a psycopg Connection; an AsyncConnection gets a clear error, not a
    coroutine nobody awaits."""
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError("an AsyncConnection needs the asyncio API: `await skiplock.AsyncApp(...).enqueue(..., conn=aconn)` "
                        "/ `enqueue_many`")


def row_of(cur: Any) -> Any:
    """The one row a statement always returns (a CTE ending in an aggregate or a SELECT of values)."""
    row = cur.fetchone()
    if row is None:
        raise RuntimeError("a statement that always returns a row returned none")
    return row


class KeyedBatch:
    """An ``enqueue_many`` call in which some items carry a unique key: what to send and what it
    gave, as steps for any driver (:meth:`PostgresBackend.enqueue_keyed_steps`; see steps.py). No I/O.

    ``keyed`` maps item index -> (unique_key, on_conflict). Each key is sent once, with its first
    item; a later item with the same key gets that item's id -- or, with ``on_conflict="raise"``, is
    refused here, before anything is sent (:class:`DuplicateJob` with ``existing_id`` None: the job
    it duplicates would be this call's own). One attempt is :meth:`insert` (the rows, and the holders
    the statement's snapshot sees), then, only if some holder committed after that snapshot,
    :meth:`inserted`'s lookup in a statement of its own; :meth:`ids` then gives the ids or says why
    the attempt must be undone: a holder finished before we read it (:class:`HolderGone`: run the
    attempt again; rare, it needs a holder committed *and* finished during our insert) or an item
    with ``on_conflict="raise"`` met a holder (:class:`DuplicateJob`: nothing is enqueued)."""

    def __init__(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]):
        self.jobs = jobs
        self.keyed = keyed
        first: dict[str, int] = {}
        self.same_as: dict[int, int] = {}  # a later item -> the first item with its key
        for i in sorted(keyed):
            key, on_conflict = keyed[i]
            j = first.setdefault(key, i)
            if j != i:
                if on_conflict == "raise":
                    raise DuplicateJob(f"item {i}: unique_key {key!r} is also item {j}'s, and on_conflict='raise'; "
                                       "nothing was enqueued", None)  # type: ignore[arg-type]
                self.same_as[i] = j
        self.sent = [i for i in range(len(jobs)) if i not in self.same_as]
        self.strict = [i for i in sorted(keyed) if keyed[i][1] == "raise"]  # none of them in same_as
        self._found: dict[int, tuple[bool, int | None]] = {}

    def insert(self, backend: "PostgresBackend") -> tuple[str, dict[str, Any]]:
        jobs = [self.jobs[i] for i in self.sent]
        return backend.q["enqueue_many_unique"], {
            "wake": backend.wake_payload, "schema": backend.schema,
            "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs], "args": [j.args_json for j in jobs],
            "priorities": [j.priority for j in jobs], "max_attempts": [j.max_attempts for j in jobs],
            "run_ats": [j.run_at for j in jobs],
            "unique_keys": [self.keyed[i][0] if i in self.keyed else None for i in self.sent],
        }

    def inserted(self, backend: "PostgresBackend", rows: Sequence[Sequence[Any]]) -> tuple[str, dict[str, Any]] | None:
        """Take :meth:`insert`'s rows ((created, id) per item sent, in order); returns the lookup to
        run next, in a new statement, or None if every item has its id."""
        if len(rows) != len(self.sent):
            raise RuntimeError(f"enqueue_many_unique returned {len(rows)} rows for {len(self.sent)} items")
        self._found = {i: (bool(created), job_id) for i, (created, job_id) in zip(self.sent, rows)}
        missing = [self.keyed[i][0] for i, (_, job_id) in self._found.items() if job_id is None]
        return (backend.q["unique_key_holders"], {"unique_keys": missing}) if missing else None

    def attempt(self, backend: "PostgresBackend") -> Steps[list[int]]:
        """One attempt as steps: the insert, the lookup if needed, then :meth:`ids` (which may raise
        HolderGone or DuplicateJob: the driver runs an attempt undoable, so either leaves nothing)."""
        lookup = self.inserted(backend, (yield self.insert(backend)))
        if lookup is not None:
            self.looked_up((yield lookup))
        return self.ids()

    def looked_up(self, rows: Sequence[Sequence[Any]]) -> None:
        holders = {key: job_id for key, job_id in rows}
        for i, (_, job_id) in list(self._found.items()):
            if job_id is None and self.keyed[i][0] in holders:
                self._found[i] = (False, holders[self.keyed[i][0]])

    def ids(self) -> list[int]:
        """The ids in input order; raises HolderGone or DuplicateJob (the first such item in input
        order) when the attempt must be undone."""
        found: dict[int, int] = {}
        for i, (_, job_id) in self._found.items():
            if job_id is None:
                raise HolderGone(self.keyed[i][0])
            found[i] = job_id
        for i in self.strict:
            if not self._found[i][0]:
                raise DuplicateJob(f"item {i}: job {found[i]} already holds unique_key {self.keyed[i][0]!r}; "
                                   "nothing was enqueued", found[i])
        return [found[self.same_as.get(i, i)] for i in range(len(self.jobs))]

    @staticmethod
    def gave_up() -> DatabaseUnavailable:
        return DatabaseUnavailable(f"unique keys kept changing hands over {KEYED_ATTEMPTS} attempts; try again")


def _on_session(verb: Any) -> Any:
    """A verb whose first argument may be a backend session (lease.py): it runs on that session's
    connection, and raises only skiplock errors (``errors.translate``). Given a psycopg connection
    (the caller's own), the verb runs on it as it is."""

    @functools.wraps(verb)
    def on_session(self: "PostgresBackend", conn: Any, *args: Any, **kwargs: Any) -> Any:
        if conn.__class__ is PostgresLease or conn.__class__ is PostgresSession:
            try:
                return verb(self, conn.conn, *args, **kwargs)
            except psycopg.Error as exc:
                raise translate(exc, self.dsn) from None
        return verb(self, conn, *args, **kwargs)

    return on_session


class PostgresBackend(PostgresReads):
    # Everything the port's capabilities name (see base.Capabilities); a backend built with
    # ``capabilities=Capabilities(server_bounds_lease=False)`` opens its leases without the
    # server-side timeouts (then the worker's watchdog bounds them: tests of that opt-out).
    capabilities = Capabilities(batched_claims=True, listen_notify=True, server_bounds_lease=True)

    def __init__(self, dsn: str, schema: str = "skiplock", *, lease_timeout: float = 600.0, pool_size: int = 8,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, capabilities: Capabilities | None = None):
        if capabilities is not None:
            self.capabilities = capabilities
        self.dsn = dsn
        self.schema = schema
        self.lease_timeout = lease_timeout
        self.connect_timeout = float(connect_timeout)
        self.q = load_queries(schema)
        # NOTIFY payloads on the fixed channel `skiplock` (a channel is never named from user input).
        self.wake_payload = f"enqueued:{schema}"
        self._pool: ConnectionPool | None = None
        self._pool_size = pool_size
        self._pool_errors = 0  # the pool's failed connection attempts when a call last timed out on it
        self._lock = threading.Lock()
        self._idle_lock = threading.Lock()
        self._idle_since: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:  # never the DSN's password
        return f"PostgresBackend({redact_dsn(self.dsn)!r}, schema={self.schema!r})"

    # ---- connections -------------------------------------------------------------------------

    def pool(self) -> ConnectionPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    quiet_driver_noise()
                    connect(self.dsn, self.connect_timeout).close()  # fail fast with a clear message if unreachable
                    pool = ConnectionPool(
                        self.dsn,
                        min_size=1,
                        max_size=self._pool_size,
                        kwargs={"autocommit": True, "application_name": "skiplock",
                                "options": session_options(self.dsn), **with_connect_timeout(self.dsn, self.connect_timeout)},
                        open=False,
                        name="skiplock",
                        reconnect_timeout=60,
                        check=self._check_pooled,
                    )
                    try:
                        pool.open(wait=True, timeout=self.connect_timeout)
                    except PoolTimeout:
                        pool.close()
                        raise DatabaseUnavailable(self._no_connection()) from None
                    self._pool = pool
                    self._pool_errors = 0
        return self._pool

    def _no_connection(self, pool: ConnectionPool | None = None) -> str:
        """The error of a call that got no connection in time (``pool``: say so if it was busy)."""
        busy = ""
        if pool is not None:
            stats = pool.get_stats()
            if stats.get("pool_size", 0) >= self._pool_size and not stats.get("pool_available"):
                busy = f"; all {self._pool_size} pooled connections were in use"
        return (f"no connection to PostgreSQL ({describe_dsn(self.dsn)}) within {self.connect_timeout:g}s "
                f"(connect_timeout){busy}")

    def _discard_pool(self, pool: ConnectionPool) -> None:
        """Replace a pool that could not connect: its own reconnect attempts back off (1 s, doubling)
        and would keep callers waiting long after the server is back; the next caller opens a new
        one, which connects at once. The old one is closed once every caller already waiting on it has
        had its connection or its timeout (connections still out then are closed when returned)."""
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
        closer = threading.Timer(self.connect_timeout + 1.0, pool.close)
        closer.name, closer.daemon = "skiplock-pool-close", True
        closer.start()

    # A pooled connection back from use within this many seconds skips the round trip of a full check.
    CHECK_AFTER_IDLE = 2.0

    def _check_pooled(self, conn: psycopg.Connection[Any]) -> None:
        """Checked as it leaves the pool. A connection idle for a while gets a round trip to the
        server (``check_connection``); a recently used one only if its socket has something to read
        -- an idle connection never does, unless the server ended the session (a restart, a
        terminate): so a connection killed by a restart is still replaced, not used, and the common
        case costs no round trip."""
        with self._idle_lock:
            since = self._idle_since.get(conn)
        if since is None or time.monotonic() - since > self.CHECK_AFTER_IDLE or conn.broken:
            ConnectionPool.check_connection(conn)
            return
        try:
            ready = bool(select.select([conn.fileno()], [], [], 0)[0])
        except (OSError, ValueError, psycopg.Error):
            ready = True
        if ready:
            ConnectionPool.check_connection(conn)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection, with a clear error when the server is gone. Connections
        are checked as they leave the pool, so one killed by a server restart is replaced, not used."""
        pool = self.pool()
        try:
            with pool.connection(timeout=self.connect_timeout) as conn:
                yield conn
            with self._idle_lock:  # here, not in the pool's reset hook: that one runs in a pool thread
                self._idle_since[conn] = time.monotonic()
        except PoolTimeout:
            errors = pool.get_stats().get("connections_errors", 0)
            unreachable = errors > self._pool_errors  # it failed to connect since we last looked
            if unreachable:
                self._pool_errors = errors
                self._discard_pool(pool)
            raise DatabaseUnavailable(self._no_connection(None if unreachable else pool)) from None
        except CONNECTION_LOST as exc:
            if not session_gone(exc):
                raise
            raise DatabaseUnavailable(f"lost the connection to PostgreSQL ({redact_dsn(self.dsn)}): "
                                      f"{redact(one_line(exc), self.dsn)}") from None

    def connect_lease(self, application_name: str = "skiplock-worker") -> PostgresLease:
        """A dedicated connection for one worker slot, as a :class:`PostgresLease`: its transactions
        are job leases, bounded by the server (lease.py) unless ``capabilities.server_bounds_lease``
        is off."""
        return PostgresLease(self.connect_lease_connection(application_name), self,
                             self.capabilities.server_bounds_lease)

    def connect_lease_connection(self, application_name: str = "skiplock-worker") -> psycopg.Connection[Any]:
        """The psycopg connection of a lease (also the outbox relay's): TCP keepalives and
        ``client_connection_check_interval`` end the session of a vanished client; with server
        bounds, ``idle_in_transaction_session_timeout`` (and, on PostgreSQL 17+, ``transaction_timeout``)
        = ``lease_timeout``."""
        ms = int(self.lease_timeout * 1000)
        bounds = f"-c idle_in_transaction_session_timeout={ms} " if self.capabilities.server_bounds_lease else ""
        options = session_options(
            self.dsn, f"{bounds}-c tcp_keepalives_idle=10 "
            "-c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c tcp_user_timeout=30000 "
            "-c client_connection_check_interval=5000")
        conn = connect(self.dsn, self.connect_timeout, autocommit=False, application_name=application_name,
                       options=options, **CLIENT_TCP)
        if bounds and conn.info.server_version >= 170000:
            conn.execute(self.q["set_transaction_timeout"], {"value": f"{ms}ms"})
            conn.commit()
        return conn

    def connect_bookkeeping(self) -> PostgresSession:
        """An autocommit session for attempt counting. ``synchronous_commit=off``: a count lost in
        a server crash costs at most one extra attempt, and it saves a WAL flush per job."""
        return PostgresSession(connect(self.dsn, self.connect_timeout, autocommit=True,
                                       application_name="skiplock-attempts",
                                       options=session_options(self.dsn, "-c synchronous_commit=off"), **CLIENT_TCP),
                               self.dsn)

    @property
    def pool_size(self) -> int:
        return self._pool_size

    def connection_budget(self) -> ConnectionBudget:
        with self._conn() as conn:
            return ConnectionBudget(*row_of(conn.execute(self.q["connection_budget"])))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ---- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in order, each recorded; safe to run concurrently."""
        bootstrap, migrations = load_migrations(self.schema)
        applied: list[int] = []
        with self._conn() as conn, conn.transaction():
            conn.execute(self.q["migrate_lock"], {"schema": self.schema})
            conn.execute(bootstrap)
            current = row_of(conn.execute(self.q["schema_version"]))[0] or 0
            latest = migrations[-1][0]
            if current > latest:
                raise SchemaError(self._newer_message(current, latest))
            for version, body in migrations:
                if version > current:
                    conn.execute(body)
                    conn.execute(self.q["record_version"], {"version": version})
                    applied.append(version)
        return applied

    def _newer_message(self, current: int, latest: int) -> str:
        return (
            f"the skiplock schema {self.schema!r} in this database is at version {current}, newer than this "
            f"skiplock knows (up to {latest}): upgrade skiplock"
        )

    def check_schema(self) -> None:
        latest = load_migrations(self.schema)[1][-1][0]
        with self._conn() as conn:
            try:
                current = row_of(conn.execute(self.q["schema_version"]))[0]
            except psycopg.errors.UndefinedTable:
                current = None
        if current is None:
            raise SchemaError(
                f"this database has no skiplock schema {self.schema!r} yet: run `skiplock migrate` (or app.migrate())"
            )
        if current > latest:
            raise SchemaError(self._newer_message(current, latest))
        if current < latest:
            raise SchemaError(
                f"the skiplock schema {self.schema!r} is at version {current}, this skiplock needs {latest}: "
                "run `skiplock migrate`"
            )

    # ---- producing ---------------------------------------------------------------------------

    def enqueue_statement(self, jobs: Sequence[NewJob]) -> tuple[str, dict[str, Any]]:
        """The one statement inserting ``jobs`` (ids come back in order), for any connection kind."""
        if len(jobs) == 1:
            j = jobs[0]
            return self.q["enqueue_one"], {
                "wake": self.wake_payload, "queue": j.queue, "task": j.task, "args": j.args_json,
                "priority": j.priority, "max_attempts": j.max_attempts, "run_at": j.run_at,
            }
        return self.q["enqueue_many"], {
            "wake": self.wake_payload, "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs],
            "args": [j.args_json for j in jobs], "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs], "run_ats": [j.run_at for j in jobs],
        }

    def enqueue_unique_statement(self, job: NewJob, unique_key: str) -> tuple[str, dict[str, Any]]:
        return self.q["enqueue_unique"], {
            "wake": self.wake_payload, "queue": job.queue, "task": job.task, "args": job.args_json, "priority": job.priority,
            "max_attempts": job.max_attempts, "run_at": job.run_at, "unique_key": unique_key,
        }

    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        """Insert jobs in one transaction, ids in input order; on ``conn`` they exist only if the
        caller commits. Fewer than COPY_MIN_JOBS: one INSERT statement; more: :meth:`_copy_jobs`
        (measured on a local socket, COPY is ahead from ~50 jobs, and 1.9x at 1,000; the threshold
        leaves room for the extra round trips of a network: BEGIN, the id reservation, COPY, COMMIT)."""
        _not_async(conn)
        if len(jobs) >= COPY_MIN_JOBS:
            if conn is None:
                with self._conn() as c, c.transaction():
                    return self._copy_jobs(c, jobs)
            # The caller's connection, unless COPY cannot run there (pipeline mode) or could fail
            # half-way (a client encoding other than UTF-8 may not represent some text: the INSERT
            # path fails on it before sending anything, leaving the caller's transaction usable).
            if not conn.pgconn.pipeline_status and conn.info.encoding == "utf-8":
                if conn.autocommit:  # two statements: a transaction of their own, all or nothing
                    with conn.transaction():
                        return self._copy_jobs(conn, jobs)
                return self._copy_jobs(conn, jobs)  # in the caller's transaction (begun if none is open)
        return self.run(self.enqueue_steps(jobs), conn)

    # Every enqueue is one of these steps generators (see steps.py), run by :meth:`run` on a
    # psycopg Connection (the caller's or a pooled one) or by :meth:`run_async` on the caller's
    # AsyncConnection: the statements, retries and errors are written once, for both.

    def enqueue_steps(self, jobs: Sequence[NewJob]) -> Steps[list[int]]:
        """Insert ``jobs`` in one statement (:meth:`enqueue_statement`); their ids in input order."""
        rows = yield self.enqueue_statement(jobs)
        return [r[0] for r in rows]

    def enqueue_unique_steps(self, job: NewJob, unique_key: str) -> Steps[tuple[int, bool]]:
        """(id, created): the new job, or the queued/running one holding ``unique_key``. No row back
        means the holder finished between the conflict and the lookup (nothing was inserted): the
        statement runs again, up to KEYED_ATTEMPTS times, then DatabaseUnavailable."""
        statement = self.enqueue_unique_statement(job, unique_key)
        for _ in range(KEYED_ATTEMPTS):
            rows = yield statement
            if rows:
                return int(rows[0][0]), bool(rows[0][1])
        raise DatabaseUnavailable(f"unique_key {unique_key!r} kept changing hands; try again")

    def enqueue_keyed_steps(self, batch: KeyedBatch) -> Steps[list[int]]:
        """``enqueue_many`` with unique keys: up to KEYED_ATTEMPTS undoable attempts
        (:meth:`KeyedBatch.attempt`), again after a HolderGone, then DatabaseUnavailable."""
        for _ in range(KEYED_ATTEMPTS):
            try:
                ids: list[int] = yield Undoable(batch.attempt(self))
                return ids
            except HolderGone:
                continue
        raise batch.gave_up()

    def run(self, steps: Steps[T], conn: Any = None) -> T:
        """Run steps on ``conn`` (the caller's psycopg Connection, in its transaction), else on a
        pooled autocommit connection."""
        _not_async(conn)
        if conn is not None:
            return run(conn, steps)
        with self._conn() as c:
            return run(c, steps)

    async def run_async(self, steps: Steps[T], conn: "psycopg.AsyncConnection[Any]") -> T:
        """Run steps on the caller's ``AsyncConnection``, in its current transaction."""
        return await run_async(conn, steps)

    def _copy_jobs(self, conn: psycopg.Connection[Any], jobs: Sequence[NewJob]) -> list[int]:
        """Inside a transaction: one statement reserves the ids (in input order), reads the
        transaction's ``now()`` and queues the wake-up NOTIFY; then COPY streams the rows, each with
        its id, in text format (psycopg formats rows in C; the server parses args as jsonb). Rows are
        sent as they are formatted, so the client's work overlaps the server's. A job without run_at
        gets that ``now()``, as ``coalesce(run_at, now())`` gives it in the INSERT path (a batch
        with none leaves the column to its default, the same ``now()``)."""
        cur = conn.cursor(row_factory=tuple_row)  # the caller's cursor class (ClientCursor: text results only)
        ids, now, _ = cur.execute(self.q["reserve_job_ids"], {"schema": self.schema, "n": len(jobs),
                                                              "wake": self.wake_payload}).fetchall()[0]
        ids.sort()  # already ascending (one nextval per row, in order); sorting makes it a guarantee
        with_run_at = any(j.run_at is not None for j in jobs)
        with cur.copy(self.q["copy_jobs_run_at" if with_run_at else "copy_jobs"]) as copy:
            copy.set_types(COPY_TYPES if with_run_at else COPY_TYPES[:-1])
            write = copy.write_row
            if with_run_at:
                for job_id, j in zip(ids, jobs):
                    write((job_id, j.queue, j.task, j.args_json, j.priority, j.max_attempts,
                           now if j.run_at is None else j.run_at))
            else:
                for job_id, j in zip(ids, jobs):
                    write((job_id, j.queue, j.task, j.args_json, j.priority, j.max_attempts))
        return ids

    def testing(self) -> Any:
        """What skiplock.testing does on this database (:class:`.testing.PostgresTesting`)."""
        from .testing import PostgresTesting

        return PostgresTesting(self, lambda name: connect(self.dsn, self.connect_timeout, autocommit=False,
                                                          application_name=name, options=session_options(self.dsn)))

    def outbox_store(self) -> Any:
        """The outbox's operations on this database (:class:`.outbox.PostgresOutboxStore`)."""
        from .outbox import PostgresOutboxStore

        return PostgresOutboxStore(self)

    def keyed_batch(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]) -> KeyedBatch:
        """An ``enqueue_many`` batch with unique keys (:class:`KeyedBatch`; refuses in-call duplicates)."""
        return KeyedBatch(jobs, keyed)

    def enqueue_keyed(self, batch: KeyedBatch, conn: Any = None) -> list[int]:
        """``enqueue_many`` with unique keys (see :class:`KeyedBatch`): ids in input order, an item
        whose key is held getting the holder's id. Always one INSERT statement (never COPY). Each
        attempt is undoable, so a refusal (DuplicateJob) or a retry leaves nothing behind: see
        :func:`steps.undoable`."""
        return self.run(self.enqueue_keyed_steps(batch), conn)

    # ---- the lease ---------------------------------------------------------------------------

    @_on_session
    def claim(self, conn: psycopg.Connection[Any], queues: Sequence[str] | None, limit: int = 1,
              savepoint: bool = False, tasks: Sequence[str] | None = None) -> list[ClaimedJob]:
        """Lock up to ``limit`` available jobs in this connection's transaction (the lease): of
        ``queues`` (None: every queue), and of the task names ``tasks`` only (None: every task --
        what a worker with ``fail_unknown_tasks`` claims). With ``savepoint``, the first job's
        SAVEPOINT is sent in the same round trip (pipeline mode, with the transaction's BEGIN)."""
        prefix = "claim" if tasks is None else "claim_tasks"
        if queues and len(queues) == 1:
            query, params = self.q[prefix], {"queue": queues[0], "limit": limit}
        elif queues:
            query, params = self.q[f"{prefix}_of_queues"], {"queues": list(queues), "limit": limit}
        else:
            query, params = self.q[f"{prefix}_any_queue"], {"limit": limit}
        if tasks is not None:
            params["tasks"] = list(tasks)
        if not savepoint:
            return [ClaimedJob(*row) for row in conn.execute(query, params).fetchall()]
        cur = conn.cursor(row_factory=tuple_row)
        with conn.pipeline():
            cur.execute(query, params)
            conn.execute(self.q["savepoint"])
        return [ClaimedJob(*row) for row in cur.fetchall()]

    @_on_session
    def start_attempt(self, conn: psycopg.Connection[Any], job: ClaimedJob, worker: str,
                      lease_pid: int | None, exclusive: bool = True,
                      batch: int | None = None) -> tuple[int, str | None, str | None, bool]:
        """Count the attempt durably, outside the job's transaction (``conn`` from connect_bookkeeping).
        ``exclusive``: no other handler can run in this process meanwhile (a one-slot worker), so this
        attempt is charged if it never finishes; a worker with several slots passes False. ``batch``:
        the live batch whose transaction the job runs in (its row keeps the job; the rows of dead
        batches no longer list it).
        Returns (attempt number, cancellation reason if one was requested, the previous attempt's error
        if that attempt finished but its outcome is still unrecorded -- see ``record_outcome`` --, and
        whether the job is a suspect: its previous attempt never finished, so this one must run
        exclusively in its process, see ``mark_exclusive``)."""
        row = row_of(conn.execute(self.q["start_attempt"], {"id": job.id, "attempts": job.attempts, "worker": worker,
                                                            "backend_pid": lease_pid, "exclusive": exclusive,
                                                            "batch": batch}))
        return int(row[0]), row[1], row[2], bool(row[3])

    @_on_session
    def mark_exclusive(self, conn: psycopg.Connection[Any], job_id: int, attempt: int) -> None:
        conn.execute(self.q["mark_exclusive"], {"id": job_id, "attempt": attempt})

    @_on_session
    def start_batch(self, conn: psycopg.Connection[Any], jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]:
        """Mark a batch durably, outside its transaction (``conn`` from connect_bookkeeping), before its
        first handler starts. Returns (batch id, suspects: jobs to run alone with a counted attempt,
        {job id: cancellation reason})."""
        batch, suspects, cancelled, reasons = row_of(conn.execute(self.q["start_batch"], {
            "ids": [j.id for j in jobs], "attempts": [j.attempts for j in jobs], "worker": worker,
            "backend_pid": lease_pid}))
        return batch, set(suspects), dict(zip(cancelled, reasons))

    @_on_session
    def forget_dead_batches(self, conn: psycopg.Connection[Any], job_id: int, batch: int) -> None:
        conn.execute(self.q["forget_dead_batches"], {"id": job_id, "batch": batch})

    @_on_session
    def complete_batch(self, conn: psycopg.Connection[Any], batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]:
        """End the batch's transaction: write ``done`` ((job, attempt, result JSON)), delete the
        batch's row and COMMIT, in one round trip (pipeline mode). Returns the ids written; a job
        missing was refused (a cancellation was requested) and is still queued, unlocked."""
        cur = conn.cursor(row_factory=tuple_row)
        with conn.pipeline():
            cur.execute(self.q["complete_batch"], {
                "ids": [d[0].id for d in done], "attempts": [d[1] for d in done], "results": [d[2] for d in done],
                "started_at": started_at, "worker": worker, "batch": batch, "prefix": f"{self.schema}:"})
            conn.commit()
        return set(row_of(cur)[0])

    def notice(self, job_id: int) -> str:
        """The payload announcing that a job finished, on the fixed channel ``skiplock``."""
        return f"{self.schema}:{job_id}"

    @_on_session
    def savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["savepoint"])

    @_on_session
    def rollback_to_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["rollback_to_savepoint"])

    @_on_session
    def release_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["release_savepoint"])

    @_on_session
    def set_local_timeouts(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        """A task's ``timeout`` for this transaction, counted from now (statement, idle and, on
        PostgreSQL 17+, transaction timeouts). Without server bounds, nothing: the watchdog bounds it."""
        if not self.capabilities.server_bounds_lease:
            return
        value = f"{max(1, int(seconds * 1000))}ms"
        conn.execute(self.q["set_local_timeouts"], {"value": value})
        if conn.info.server_version >= 170000:
            conn.execute(self.q["stop_local_transaction_timeout"])  # so the next one re-arms the timer
            conn.execute(self.q["set_local_transaction_timeout"], {"value": value})

    @_on_session
    def complete(self, conn: psycopg.Connection[Any] | None, job: ClaimedJob, attempt: int, result_json: str | None,
                 started_at: datetime, worker: str, owner: uuid.UUID | None = None) -> bool:
        """False if the job was not written done (a cancellation was requested, or -- claimed lease --
        the lease is no longer ``owner``'s). ``conn`` None (claimed lease only: the fence is the lease,
        not a lock): a pooled connection, committed at once."""
        row = self._one("complete", {"id": job.id, "attempt": attempt, "result": result_json,
                                     "started_at": started_at, "worker": worker, "owner": owner,
                                     "notice": self.notice(job.id)}, conn)
        return bool(row[0])

    @_on_session
    def record_outcome(self, conn: psycopg.Connection[Any] | None, job: ClaimedJob, attempt: int, *, state: str,
                       delay: float | None, error: str | None, started_at: datetime, worker: str,
                       uncount: bool = False, owner: uuid.UUID | None = None) -> str | None:
        """Write a retry/failed/cancelled outcome; returns the state written, None if skipped (or,
        claimed lease, fenced off because the lease is no longer ``owner``'s). Transaction lease
        (``conn`` None): a row still locked by another session is skipped without waiting, and the
        error is kept in job_attempts until the job's next finishing write records it."""
        row = self._one("record_outcome", {
            "id": job.id, "attempt": attempt, "state": state, "delay": delay, "error": error, "owner": owner,
            "started_at": started_at, "worker": worker, "uncount": uncount, "notice": self.notice(job.id)}, conn)
        return row[0] if row else None

    def terminate(self, backend_pids: Sequence[int]) -> None:
        """End these sessions (their transactions roll back). Raises only skiplock errors."""
        if backend_pids:
            try:
                self._all("terminate_backends", {"pids": list(backend_pids)})
            except psycopg.Error as exc:
                raise translate(exc, self.dsn) from None

    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The worker's one finishing write (base.Finish): ``done`` by ``complete`` (guarded on a
        pending cancellation; fenced on owner for a claimed lease), any other state by
        ``record_outcome`` (after rolling back to the job's savepoint when the write says ``undo``),
        a batch's deferred ``done`` writes by ``complete_batch`` with the COMMIT. ``Via.FRESH`` (or no
        lease): from a pooled connection, committed at once. Raises only skiplock errors."""
        try:
            if what.via is Via.BATCH_COMMIT:
                assert lease is not None and what.batch is not None
                writes = what.writes
                first = writes[0] if writes else None
                ids = self.complete_batch(lease.conn, what.batch, [(w.job, w.attempt, w.result) for w in writes],
                                          first.started_at if first else None, first.worker if first else None)
                return {i: "done" for i in ids}
            (w,) = what.writes
            conn = None if lease is None or what.via is Via.FRESH else lease.conn
            if w.state == "done":
                done = self.complete(conn, w.job, w.attempt, w.result, w.started_at, w.worker, w.owner)
                return {w.job.id: "done"} if done else {}
            if w.undo and conn is not None:
                conn.execute(self.q["rollback_to_savepoint"])
            state = self.record_outcome(conn, w.job, w.attempt, state=w.state, delay=w.delay, error=w.error,
                                        started_at=w.started_at, worker=w.worker, uncount=w.uncount, owner=w.owner)
            return {} if state is None else {w.job.id: state}
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    # ---- reading -----------------------------------------------------------------------------

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        with self._conn() as c:
            return c.cursor(row_factory=dict_row).execute(self.q["get_job"], {"id": job_id}).fetchone()

    def list_jobs(self, *, state: str | None = None, queue: str | None = None,
                  task: str | None = None, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first; ``before``: the last id of the previous page (keyset). 'running' is read
        through the jobs in flight (``list_running_jobs``), not by scanning every job."""
        name = "list_running_jobs" if state == "running" else "list_jobs"
        with self._conn() as c:
            cur = c.cursor(row_factory=dict_row)
            return cur.execute(self.q[name], {"state": state, "queue": queue, "task": task, "limit": limit,
                                              "before": before}).fetchall()

    def counts(self) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], int(r[2])) for r in self._all("counts", {})]

    # ---- the read model (see skiplock/readmodel.py; statements in queries.sql's read model section) --

    def running_now(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("running_now", {"after": after, "limit": limit})]

    def batches_in_flight(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("batches_in_flight", {"after": after, "limit": limit})]

    def live_worker_rows(self, live_seconds: float, after: tuple[datetime, uuid.UUID] | None,
                         limit: int) -> list[tuple[Any, ...]]:
        started, worker_id = after if after is not None else (None, None)
        return [tuple(r) for r in self._all("live_worker_rows", {"live": live_seconds, "after_started": started,
                                                                 "after_id": worker_id, "limit": limit})]

    def failure_classes(self, since: datetime | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("failure_classes", {"since": since})]

    def oldest_ready(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("oldest_ready", {})]

    # ---- workers running now (their names, tasks and queues, as each says itself) ----------------

    def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None, *,
                    host: str | None = None, pid: int | None = None, concurrency: int | None = None) -> None:
        self._one("worker_seen", {"id": worker_id, "name": name, "tasks": list(tasks),
                                  "queues": None if queues is None else list(queues),
                                  "host": host, "pid": pid, "concurrency": concurrency})

    def worker_gone(self, worker_id: uuid.UUID) -> None:
        """Delete this worker's row. Raises only skiplock errors."""
        try:
            self._one("worker_gone", {"id": worker_id})
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    def live_workers(self, live_seconds: float) -> int:
        """How many workers were seen within ``live_seconds``."""
        return int(self._one("live_workers", {"live": live_seconds})[0])

    def untakeable(self, live_seconds: float) -> list[tuple[str, str, int]]:
        """(queue, task, queued jobs) that no worker seen within ``live_seconds`` can take."""
        return [(r[0], r[1], int(r[2])) for r in self._all("untakeable", {"live": live_seconds})]

    # ---- lifecycle ---------------------------------------------------------------------------

    def enqueue_unique(self, job: NewJob, unique_key: str, conn: Any = None) -> tuple[int, bool]:
        """(id, created): the new job, or the queued/running one holding ``unique_key``
        (:meth:`enqueue_unique_steps`)."""
        return self.run(self.enqueue_unique_steps(job, unique_key), conn)

    def request_cancel(self, job_id: int, reason: str) -> str | None:
        row = self._one("request_cancel", {"id": job_id, "reason": reason})
        return row[0] if row else None

    def cancel_if_unlocked(self, job_id: int) -> bool:
        return self._one("cancel_if_unlocked", {"id": job_id, "notice": self.notice(job_id)}) is not None

    def end_lease_holder(self, job_id: int) -> bool:
        return self._one("end_lease_holder", {"id": job_id}) is not None

    def forget_cancel_request(self, job_id: int) -> None:
        self._one("forget_cancel_request", {"id": job_id})

    def retry_job(self, job_id: int) -> bool:
        """True if the job was put back; False if it does not exist, is not failed or cancelled, or
        a queued or running job holds its unique_key (also one committed during this statement)."""
        try:
            return self._one("retry_job", {"id": job_id}) is not None
        except psycopg.errors.UniqueViolation:
            return False

    def unique_key_holder(self, unique_key: str) -> tuple[int, str] | None:
        """(id, state) of the queued or running job holding ``unique_key``, if any."""
        row = self._one("unique_key_holder", {"unique_key": unique_key})
        return (int(row[0]), row[1]) if row else None

    def retry_failed(self, queue: str | None) -> list[tuple[int, str | None, bool, int | None]]:
        """One row per failed job (of ``queue``), in id order: (id, unique_key, retried, id of the job
        holding its key when not retried). Keys taken while it runs make the statement fail on the
        unique index, undoing it: it runs again, seeing the new holders."""
        for _ in range(KEYED_ATTEMPTS):
            try:
                return [(int(r[0]), r[1], bool(r[2]), r[3]) for r in self._all("retry_failed", {"queue": queue})]
            except psycopg.errors.UniqueViolation:
                continue
        raise DatabaseUnavailable(f"unique keys of failed jobs kept changing hands over {KEYED_ATTEMPTS} attempts; "
                                  "try again")

    def queue_known(self, queue: str) -> bool:
        return bool(self._one("queue_known", {"queue": queue})[0])

    def pause_queue(self, queue: str) -> None:
        self._one("pause_queue", {"queue": queue})

    def resume_queue(self, queue: str) -> bool:
        return self._one("resume_queue", {"queue": queue}) is not None

    def paused_queues(self) -> list[str]:
        return [r[0] for r in self._all("paused_queues")]

    def add_waiter(self, job_id: int) -> None:
        self._one("add_waiter", {"id": job_id})

    def remove_waiter(self, job_id: int) -> None:
        self._one("remove_waiter", {"id": job_id})

    def connect_listener(self) -> PostgresNotifications:
        """An autocommit connection LISTENing on the fixed channel ``skiplock`` (never a user-named one),
        as the port's Notifications (see notifications.py): only skiplock errors."""
        conn = connect(self.dsn, self.connect_timeout, autocommit=True, application_name="skiplock-listener",
                       options=session_options(self.dsn), **CLIENT_TCP)
        try:
            conn.execute(self.q["listen"])
        except psycopg.Error as exc:
            conn.close()
            raise DatabaseUnavailable(f"cannot LISTEN on PostgreSQL ({redact_dsn(self.dsn)}): "
                                      f"{redact(one_line(exc), self.dsn)}") from None
        return PostgresNotifications(conn, self.dsn)

    def prune(self, state: str, age_seconds: float, batch: int) -> int | None:
        """Delete one batch; None if another process holds the maintenance lock."""
        with self._conn() as c, c.transaction():
            if not row_of(c.execute(self.q["try_maintenance_lock"], {"schema": self.schema}))[0]:
                return None
            return int(row_of(c.execute(self.q["prune"], {"state": state, "age": age_seconds, "batch": batch}))[0])

    def jobs_vacuum_threshold(self) -> float:
        """Dead tuples at which autovacuum vacuums the jobs table (its storage parameters first)."""
        row = self._one("jobs_vacuum_threshold", {"schema": self.schema})
        if row is None or row[0] is None:
            raise RuntimeError(f"no jobs table in schema {self.schema!r}")
        return float(row[0])

    def prune_ticks(self, age_seconds: float) -> None:
        self._one("prune_ticks", {"age": age_seconds})
        self._one("prune_batches", {})

    def enqueue_tick(self, schedule: str, tick: datetime, job: NewJob) -> int | None:
        """Enqueue ``job`` for this tick unless some scheduler already did; returns the new job id."""
        with self._conn() as c, c.transaction():
            if c.execute(self.q["insert_tick"], {"schedule": schedule, "tick": tick}).fetchone() is None:
                return None
            job_id = self.enqueue([job], c)[0]
            c.execute(self.q["set_tick_job"], {"schedule": schedule, "tick": tick, "job_id": job_id})
            return job_id

    def last_tick(self, schedule: str) -> datetime | None:
        return self._one("last_tick", {"schedule": schedule})[0]

    # ---- the claimed lease -------------------------------------------------------------------

    @_on_session
    def start_claimed(self, conn: psycopg.Connection[Any], job: ClaimedJob, owner: uuid.UUID, lease: float,
                      worker: str) -> tuple[int, str | None] | None:
        row = self._one("start_claimed", {"id": job.id, "owner": owner, "lease": lease, "worker": worker}, conn)
        return (int(row[0]), row[1]) if row else None

    def heartbeat(self, leases: Sequence[tuple[int, uuid.UUID, float]]) -> set[int]:
        """Extend these leases; returns the ids still owned."""
        rows = self._all("heartbeat", {"ids": [x[0] for x in leases], "owners": [x[1] for x in leases],
                                       "leases": [x[2] for x in leases]})
        return {r[0] for r in rows}

    def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]:
        return [(r[0], r[1]) for r in self._all("rescue_expired", {"batch": batch, "prefix": f"{self.schema}:"})]

    def cancel_running(self, job_id: int) -> bool:
        return self._one("cancel_running", {"id": job_id, "notice": self.notice(job_id)}) is not None

    # ---- plumbing ----------------------------------------------------------------------------

    def _one(self, name: str, params: dict[str, Any] | None = None, conn: Any = None) -> Any:
        """Run a named statement (on ``conn``, else a pooled connection); its first row or None."""
        if conn is not None:
            cur = conn.cursor(row_factory=tuple_row).execute(self.q[name], params)
            return cur.fetchone() if cur.description else None
        with self._conn() as c:
            cur = c.execute(self.q[name], params)
            return cur.fetchone() if cur.description else None

    def _all(self, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        with self._conn() as c:
            return c.execute(self.q[name], params).fetchall()
