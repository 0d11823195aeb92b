"""PostgreSQL connections: the pool, the lease and bookkeeping sessions, the listener.

Two kinds of connection:
- a small autocommit pool for short operations (enqueue, reads, attempt counting, migrations);
- one dedicated connection per worker slot whose transaction is the job's lease. It carries session
  bounds so a paused, hung or partitioned worker cannot hold a job forever: the server ends a lease
  transaction idle (or, on PostgreSQL 17+, open) longer than ``lease_timeout``, probes the client
  with TCP keepalives and ``client_connection_check_interval``, and drops it after
  ``tcp_user_timeout`` of unacknowledged data. Any of these rolls the job back to the queue.

Opening one connection (bounded wait, READ COMMITTED, the server version refused below the minimum,
redacted errors) is connecting.py's.

Connecting is bounded by ``connect_timeout`` (``App(connect_timeout=...)``, default
DEFAULT_CONNECT_TIMEOUT seconds): the longest an operation on the pool (an ``enqueue`` without the
caller's connection, say) waits for a connection before it raises DatabaseUnavailable -- while the
server is down, or while every pooled connection is in use -- and libpq's ``connect_timeout`` of every
connection skiplock opens (whole seconds, at least 2; a DSN's own ``connect_timeout`` wins there).
"""

from __future__ import annotations

import select
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import ConnectionLost, DatabaseUnavailable, redact, redact_dsn
from ...reconnect import quiet_driver_noise
from ..base import Capabilities
from .connecting import (CLIENT_TCP, DEFAULT_CONNECT_TIMEOUT, ConnectionBudget, connect, describe_dsn, row_of,
                         session_options, with_connect_timeout)
from .errors import connection_lost, one_line, translate, translated
from .lease import PostgresLease, PostgresSession
from .notifications import PostgresNotifications
from .pooler import Pooling, PollingNotifications, detect, report
from .queries import load_queries

class PostgresConnections:
    """The backend's connections and the plumbing every verb uses (``_conn``, ``_one``, ``_all``).
    The verbs live in mixins (producing.py, leasing.py, operating.py); backend.py assembles them."""

    # Everything the port's capabilities name (see base.Capabilities); a backend built with
    # ``capabilities=Capabilities(server_bounds_lease=False)`` opens its leases without the
    # server-side timeouts (then the worker's watchdog bounds them: tests of that opt-out).
    capabilities = Capabilities(batched_claims=True, listen_notify=True, server_bounds_lease=True, flow_control=True,
                                claim_while_committing=True, claimable_queues=True)

    def __init__(self, dsn: str, schema: str = "skiplock", *, lease_timeout: float = 600.0, pool_size: int = 8,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, capabilities: Capabilities | None = None,
                 direct_dsn: str | None = None):
        if capabilities is not None:
            self.capabilities = capabilities
        self.dsn = dsn
        # A DSN of the server itself, for what cannot go through a transaction pooler (LISTEN): pooler.py.
        self.direct_dsn = direct_dsn
        self._pooling: Pooling | None = None
        self._pooling_lock = threading.Lock()
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
                    self.pooling  # connects: fails fast with a clear message if unreachable
                    pool = ConnectionPool(
                        self.dsn,
                        min_size=1,
                        max_size=self._pool_size,
                        kwargs={"autocommit": True, "application_name": "skiplock", **self._startup(),
                                **with_connect_timeout(self.dsn, self.connect_timeout)},
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

    @property
    def pooling(self) -> Pooling:
        """Whether a connection pooler is in between, and its mode (pooler.py), found at the first use."""
        if self._pooling is None:
            with self._pooling_lock, translated(self.dsn):  # a driver error mid-detection: skiplock's
                if self._pooling is None:
                    found = detect(lambda: connect(self.dsn, self.connect_timeout, autocommit=True,
                                                   application_name="skiplock"), self.q["backend_pid"], self.dsn)
                    isolation = None
                    if found.pooled:
                        with connect(self.dsn, self.connect_timeout, autocommit=True, **found.connect_kwargs()) as c:
                            isolation = str(row_of(c.execute(self.q["default_isolation"]))[0])
                    report(found, self.dsn, self.direct_dsn, isolation)
                    self._pooling = found
        return self._pooling

    def _startup(self, *settings: str) -> dict[str, Any]:
        """The connection arguments that carry a session's ``settings`` (``-c name=value`` each) and
        READ COMMITTED: the ``options`` start-up parameter on a direct connection; behind a pooler,
        nothing (a lease sets its bounds per transaction: :meth:`begin_lease_transaction`), and no
        prepared statements behind a transaction pooler."""
        pooling = self.pooling
        if pooling.pooled:
            return pooling.connect_kwargs()
        return {"options": session_options(self.dsn, *settings)}

    def begin_lease_transaction(self, conn: psycopg.Connection[Any]) -> tuple[int, Any] | None:
        """Behind a pooler, start a lease transaction on ``conn`` with its bounds set for it (``SET
        LOCAL``) and return its server session (pid, transaction start); directly, nothing (the
        session has its bounds from its start)."""
        if not self.pooling.pooled:
            return None
        ms = f"{int(self.lease_timeout * 1000)}ms" if self.capabilities.server_bounds_lease else None
        row = row_of(conn.execute(self.q["lease_prologue"], {"value": ms}))
        return int(row[0]), row[1]

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
        """A pooled autocommit connection, with a clear error when the server is gone (``ConnectionLost``)
        and any other driver error as :class:`~skiplock.errors.DatabaseError`. Connections
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
        except psycopg.Error as exc:  # the port raises only skiplock errors
            if connection_lost(exc):
                raise ConnectionLost(f"lost the connection to PostgreSQL ({redact_dsn(self.dsn)}): "
                                     f"{redact(one_line(exc), self.dsn)}") from None
            raise translate(exc, self.dsn) from None  # DatabaseError: refused on a live session

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
        startup = self._startup(
            f"{bounds}-c tcp_keepalives_idle=10 "
            "-c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c tcp_user_timeout=30000 "
            "-c client_connection_check_interval=5000")
        conn = connect(self.dsn, self.connect_timeout, autocommit=False, application_name=application_name,
                       **startup, **CLIENT_TCP)
        if self.pooling.pooled:  # the bounds: per transaction (begin_lease_transaction); READ COMMITTED by BEGIN
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            return conn
        if bounds and conn.info.server_version >= 170000:
            conn.execute(self.q["set_transaction_timeout"], {"value": f"{ms}ms"})
            conn.commit()
        return conn

    def connect_bookkeeping(self) -> PostgresSession:
        """An autocommit session for attempt counting. ``synchronous_commit=off``: a count lost in
        a server crash costs at most one extra attempt, and it saves a WAL flush per job.
        ``plan_cache_mode=force_generic_plan``: only skiplock's own statements run here (keyed
        writes and lookups: their plans do not depend on the values), and the server otherwise
        planned `start_batch` and `start_attempt` anew at almost every run -- their generic plans
        look costlier than one made for a short array -- at 0.1-0.2 ms of server CPU each
        (docs/benchmarks.md, "Session 12")."""
        return PostgresSession(connect(self.dsn, self.connect_timeout, autocommit=True,
                                       application_name="skiplock-attempts",
                                       **self._startup("-c synchronous_commit=off",
                                                       "-c plan_cache_mode=force_generic_plan"), **CLIENT_TCP),
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

    def connect_listener(self) -> PostgresNotifications:
        """An autocommit connection LISTENing on the fixed channel ``skiplock`` (never a user-named one),
        as the port's Notifications (see notifications.py): only skiplock errors. Behind a transaction
        pooler (pooler.py) on ``direct_dsn``, the server itself; without one, a Notifications that
        never receives any (waiters poll: the pooler's WARNING said so)."""
        dsn, startup = self.dsn, self._startup()
        if self.pooling.per_transaction:
            if self.direct_dsn is None:
                return PollingNotifications()  # type: ignore[return-value]
            dsn, startup = self.direct_dsn, {"options": session_options(self.direct_dsn)}
        conn = connect(dsn, self.connect_timeout, autocommit=True, application_name="skiplock-listener",
                       **startup, **CLIENT_TCP)
        try:
            conn.execute(self.q["listen"])
        except psycopg.Error as exc:
            conn.close()
            raise DatabaseUnavailable(f"cannot LISTEN on PostgreSQL ({redact_dsn(dsn)}): "
                                      f"{redact(one_line(exc), dsn)}") from None
        return PostgresNotifications(conn, dsn)

    def terminate(self, backend_pids: Sequence[int]) -> None:
        """End these sessions (their transactions roll back). Raises only skiplock errors."""
        if backend_pids:
            self._all("terminate_backends", {"pids": list(backend_pids)})

    def notice(self, job_id: int) -> str:
        """The payload announcing that a job finished, on the fixed channel ``skiplock``."""
        return f"{self.schema}:{job_id}"

    # ---- plumbing ----------------------------------------------------------------------------

    def _one(self, name: str, params: dict[str, Any] | None = None, conn: Any = None) -> Any:
        """Run a named statement (on ``conn``, else a pooled connection); its first row or None.
        Driver errors come out as skiplock errors either way."""
        if conn is not None:
            try:
                cur = conn.cursor(row_factory=tuple_row).execute(self.q[name], params)
                return cur.fetchone() if cur.description else None
            except psycopg.Error as exc:
                raise translate(exc, self.dsn) from None
        with self._conn() as c:
            cur = c.execute(self.q[name], params)
            return cur.fetchone() if cur.description else None

    def _all(self, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        with self._conn() as c:
            return c.execute(self.q[name], params).fetchall()
