"""MySQLBackend: the backend port (base.Backend) on MySQL 8.0.1+ / MariaDB 10.6+ through PyMySQL.

What it guarantees, as PostgresBackend does (docs/guarantees.md, docs/mysql.md):

- every session it opens runs at READ COMMITTED in UTC with a short ``innodb_lock_wait_timeout``
  (``session_setup``); lease sessions also get MariaDB's ``idle_transaction_timeout`` =
  ``lease_timeout`` where the server has it;
- the claim is ``SELECT … ORDER BY priority, id LIMIT n FOR UPDATE SKIP LOCKED`` on an index whose
  columns are its equality filters then exactly its ORDER BY; a deadlock (1213) or lock wait timeout
  (1205) during it rolls the whole attempt back and retries (a few times, with jitter);
- start-up refuses ``binlog_format = STATEMENT`` (SKIP LOCKED is unsafe for statement-based
  replication: the rows a replica would lock differ), warns on MIXED;
- migrations without transactional DDL: idempotent steps, recorded, serialised by GET_LOCK; a
  half-applied version is finished by ``migrate`` and reported by ``check_schema``;
- only skiplock errors leave it; no message or repr carries the password; identifiers are the
  validated, quoted table names of :func:`names`; every value is a bound parameter.

Not yet (issue 12; see docs/mysql.md): the claimed lease, batches, cron, the read model's views,
pending errors, keyed batches, the outbox and ``AsyncApp``. Those verbs raise
:class:`NotImplementedError` naming the issue.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from typing import Any, Generator, Iterator, Mapping, Sequence, TypeVar

import pymysql

from ...errors import ConfigurationError, DatabaseUnavailable, SchemaError, redact_dsn
from ..base import Capabilities, ClaimedJob, Finish, Lease, NewJob, Via
from .dsn import connect_args
from .errors import RETRYABLE, code, connection_lost, translate, translated
from .lease import MySQLLease, MySQLSession

log = logging.getLogger("skiplock.mysql")
T = TypeVar("T")

TABLES = ("jobs", "job_attempts", "job_cancellations", "paused_queues", "schema_version", "migration_steps",
          "workers")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LOCK_WAIT_SECONDS = 5  # innodb_lock_wait_timeout of every skiplock session
CLAIM_RETRIES = 5
ENQUEUE_CHUNK = 1000
NOT_YET = "not yet on the MySQL/MariaDB backend (issue 12)"


def quote_identifier(name: str) -> str:
    """A strict quoting: ``name`` must be an unquoted-safe identifier of at most 64 characters
    ([A-Za-z_][A-Za-z0-9_]*), then back-quoted. Anything else is a ConfigurationError."""
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ConfigurationError(f"invalid MySQL identifier {name!r}: letters, digits and _ only, "
                                 "at most 64 characters, not starting with a digit")
    return f"`{name}`"


def names(schema: str) -> dict[str, str]:
    """The quoted table names for ``schema`` (their prefix: MySQL's schema is the DSN's database)."""
    return {t: quote_identifier(f"{schema}_{t}") for t in TABLES}


def _load(filename: str, tables: Mapping[str, str]) -> str:
    text = resources.files(__package__).joinpath(filename).read_text()
    return re.sub(r"\{(" + "|".join(TABLES) + r")\}", lambda m: tables[m.group(1)], text).replace("{{", "{").replace("}}", "}")


def _named(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
        found[name.strip()] = "\n".join(lines).strip().rstrip(";")
    return found


def migrations(tables: Mapping[str, str]) -> list[tuple[int, list[tuple[str, str]]]]:
    """[(version, [(step name, SQL)])] from migrations/NNNN_*.sql, in version order."""
    out = []
    for entry in sorted(resources.files(__package__).joinpath("migrations").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = _load(f"migrations/{entry.name}", tables)
        steps = []
        for block in re.split(r"^-- step: ", text, flags=re.M)[1:]:
            name, _, body = block.partition("\n")
            sql = "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("--")).strip().rstrip(";")
            steps.append((name.strip(), sql))
        out.append((int(entry.name[:4]), steps))
    return out


def _utc(value: Any) -> Any:
    return value.replace(tzinfo=timezone.utc) if isinstance(value, datetime) and value.tzinfo is None else value


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


JOB_COLUMNS = ("id", "queue", "task", "args", "priority", "state", "attempts", "max_attempts", "run_at",
               "created_at", "started_at", "finished_at", "last_error", "errors", "result", "worker",
               "unique_key", "lease_expires_at")


def _job(row: Sequence[Any]) -> dict[str, Any]:
    job = dict(zip(JOB_COLUMNS, row))
    for key in ("args", "errors", "result"):
        if job[key] is not None:
            job[key] = json.loads(job[key])
    for key in ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at"):
        job[key] = _utc(job[key])
    job["id"], job["attempts"] = int(job["id"]), int(job["attempts"])
    return job


def _claimed(row: Sequence[Any]) -> ClaimedJob:
    return ClaimedJob(int(row[0]), row[1], row[2], json.loads(row[3]), int(row[4]), int(row[5]), int(row[6]),
                      _utc(row[7]), _utc(row[8]), _utc(row[9]))


class _OnConn:
    """A statement step of this backend: ``fn(connection)`` gives the step's result."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any):
        self.fn = fn


def _drive(conn: Any, steps: Generator[Any, Any, T]) -> T:
    sent: Any = None
    while True:
        try:
            step = steps.send(sent)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if not isinstance(step, _OnConn):
            raise TypeError(f"not a MySQL statement step: {step!r}")
        sent = step.fn(conn)


@dataclass
class ConnectionBudget:
    """What the server allows this user now: each limit with the sessions counted against it."""

    max_connections: int
    in_use: int
    user_limit: int  # max_user_connections; 0: none
    user_in_use: int
    user: str
    database: str

    def available(self) -> tuple[int, str]:
        """(sessions that can still be opened, the limit that decides it, in words)."""
        limits = [(self.max_connections - self.in_use,
                   f"server max_connections {self.max_connections}, {self.in_use} in use")]
        if self.user_limit > 0:
            limits.append((self.user_limit - self.user_in_use,
                           f"max_user_connections {self.user_limit} for {self.user}, {self.user_in_use} in use"))
        free, why = min(limits)
        return max(0, free), why


class MySQLBackend:
    """The port on MySQL/MariaDB (see the module docstring). Nothing connects before first use."""

    wake_payload = "wake"
    capabilities = Capabilities(batched_claims=False, listen_notify=False, server_bounds_lease=False)

    def __init__(self, dsn: str, schema: str = "skiplock", *, lease_timeout: float = 600.0,
                 connect_timeout: float = 5.0, pool_size: int = 8):
        self.dsn = dsn
        self.schema = schema
        self.lease_timeout = lease_timeout
        self.connect_timeout = connect_timeout
        self.pool_size = pool_size
        self._args = connect_args(dsn)
        self.tables = names(schema)
        self.q = _named(_load("queries.sql", self.tables))
        self._pool: list[Any] = []
        self._pool_lock = threading.Lock()
        self._checked: bool = False
        self._autoinc_consecutive = True
        self._idle_transaction_timeout: bool | None = None

    def __repr__(self) -> str:  # never the password
        return f"MySQLBackend({redact_dsn(self.dsn)!r}, schema={self.schema!r})"

    # ---- connections ---------------------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> Any:
        args = dict(self._args)
        args.setdefault("connect_timeout", self.connect_timeout)
        try:
            conn = pymysql.connect(**args, autocommit=autocommit, charset="utf8mb4")
        except pymysql.err.MySQLError as exc:
            err = translate(exc, self.dsn)
            raise DatabaseUnavailable(f"cannot connect to MySQL at {redact_dsn(self.dsn)}: {err}") from None
        try:
            with translated(self.dsn), conn.cursor() as cur:
                cur.execute(self.q["session_setup"], {"lock_wait": LOCK_WAIT_SECONDS})
                cur.execute(self.q["session_isolation"])
            if not self._checked:
                self._start_up_checks(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _start_up_checks(self, conn: Any) -> None:
        """binlog_format (SKIP LOCKED is unsafe for statement-based replication: refused), the
        auto-increment lock mode (consecutive ids of a multi-row insert), idle_transaction_timeout."""
        with translated(self.dsn), conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.binlog_format, @@GLOBAL.log_bin, @@innodb_autoinc_lock_mode")
            binlog_format, log_bin, autoinc = cur.fetchone()
            cur.execute("SELECT COUNT(*) FROM information_schema.GLOBAL_VARIABLES "
                        "WHERE VARIABLE_NAME = 'IDLE_TRANSACTION_TIMEOUT'")
            self._idle_transaction_timeout = bool(cur.fetchone()[0])
        if int(log_bin or 0) and str(binlog_format).upper() == "STATEMENT":
            raise ConfigurationError(
                "the MySQL server logs its binary log with binlog_format=STATEMENT: SELECT … FOR UPDATE "
                "SKIP LOCKED is unsafe for statement-based replication (a replica would lock other rows); "
                "set binlog_format=ROW (see docs/mysql.md)")
        if int(log_bin or 0) and str(binlog_format).upper() == "MIXED":
            log.warning("binlog_format=MIXED: SKIP LOCKED statements are logged row-based; ROW is recommended")
        self._autoinc_consecutive = int(autoinc) in (0, 1)
        self._checked = True

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled autocommit connection; one that failed with a lost session is discarded."""
        with self._pool_lock:
            conn = self._pool.pop() if self._pool else None
        if conn is None:
            conn = self._connect(autocommit=True)
        ok = False
        try:
            yield conn
            ok = True
        except pymysql.err.MySQLError as exc:
            ok = not connection_lost(exc)
            raise translate(exc, self.dsn) from None
        finally:
            if ok and conn.open and not (conn.server_status & 1):  # not left in a transaction
                with self._pool_lock:
                    if len(self._pool) < self.pool_size:
                        self._pool.append(conn)
                        conn = None
            if conn is not None:
                try:
                    conn.close()
                except pymysql.err.Error:
                    pass

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A pooled connection in a transaction: committed at the end, rolled back on an error."""
        with self._conn() as conn:
            conn.begin()
            try:
                yield conn
            except BaseException:
                if conn.open:
                    try:
                        conn.rollback()
                    except pymysql.err.Error:
                        pass
                raise
            conn.commit()

    def connect_lease(self, application_name: str = "skiplock-worker") -> MySQLLease:
        conn = self._connect(autocommit=False)
        if self._idle_transaction_timeout:
            with translated(self.dsn), conn.cursor() as cur:
                cur.execute("SET SESSION idle_transaction_timeout = %s", (max(1, int(self.lease_timeout)),))
        return MySQLLease(conn, self)

    def connect_bookkeeping(self) -> MySQLSession:
        return MySQLSession(self._connect(autocommit=True), self.dsn)

    def connect_listener(self) -> Any:
        raise NotImplementedError(f"LISTEN/NOTIFY: MySQL has none, the worker polls ({NOT_YET})")

    def connection_budget(self) -> "ConnectionBudget":
        """What the server lets this user open now (see ``connection_budget`` in queries.sql)."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["connection_budget"])
            row = cur.fetchone()
        return ConnectionBudget(int(row[0]), int(row[1]), int(row[2]), int(row[3]), str(row[4]), str(row[5]))

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            try:
                conn.close()
            except pymysql.err.Error:
                pass

    # ---- schema --------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply what is missing, serialised across processes by GET_LOCK; returns the versions applied
        (a half-applied one included: its recorded steps are skipped, the rest run -- each idempotent)."""
        lock = f"skiplock:{self._args['database']}.{self.schema}"[:64]
        applied: list[int] = []
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, %s)", (lock, 60))
            if cur.fetchone()[0] != 1:
                raise DatabaseUnavailable(f"another process holds the migration lock {lock!r} for over 60 s")
            try:
                versions, steps_done = self._applied(cur)
                for version, steps in migrations(self.tables):
                    if version in versions:
                        continue
                    for name, sql in steps:
                        if (version, name) in steps_done:
                            continue
                        cur.execute(sql)
                        self._record_step(cur, version, name)  # done: not run again by a resumed migrate
                    cur.execute(f"INSERT IGNORE INTO {self.tables['schema_version']} (version, applied_at) "
                                "VALUES (%s, UTC_TIMESTAMP(6))", (version,))
                    applied.append(version)
            finally:
                cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
        return applied

    def _existing(self, cur: Any) -> set[str]:
        cur.execute("SELECT table_name FROM information_schema.TABLES WHERE table_schema = DATABASE()")
        prefix = f"{self.schema}_"
        return {r[0][len(prefix):] for r in cur.fetchall() if r[0].startswith(prefix)}

    def _record_step(self, cur: Any, version: int, name: str) -> None:
        cur.execute(f"INSERT IGNORE INTO {self.tables['migration_steps']} (version, step, done_at) "
                    "VALUES (%s, %s, UTC_TIMESTAMP(6))", (version, name))

    def _applied(self, cur: Any) -> tuple[set[int], set[tuple[int, str]]]:
        existing = self._existing(cur)
        versions: set[int] = set()
        steps: set[tuple[int, str]] = set()
        if "schema_version" in existing:
            cur.execute(f"SELECT version FROM {self.tables['schema_version']}")
            versions = {int(r[0]) for r in cur.fetchall()}
        if "migration_steps" in existing:
            cur.execute(f"SELECT version, step FROM {self.tables['migration_steps']}")
            steps = {(int(r[0]), r[1]) for r in cur.fetchall()}
        return versions, steps

    def check_schema(self) -> None:
        """SchemaError if the schema is missing, half-applied (named, with what to run), or newer."""
        with self._conn() as conn, conn.cursor() as cur:
            versions, steps = self._applied(cur)
        known = [v for v, _ in migrations(self.tables)]
        half = sorted({v for v, _ in steps} - versions)
        if half:
            raise SchemaError(f"the skiplock schema {self.schema!r} has a half-applied migration {half[0]} "
                              "(a migrate was interrupted): run `skiplock migrate` to finish it")
        if not versions:
            raise SchemaError(f"no skiplock schema {self.schema!r} in this database: run `skiplock migrate`")
        if max(versions) > max(known):
            raise SchemaError(f"the skiplock schema {self.schema!r} is at version {max(versions)}, newer than "
                              f"this skiplock ({max(known)}): upgrade skiplock")
        if set(known) - versions:
            raise SchemaError(f"the skiplock schema {self.schema!r} is at version {max(versions)}, this "
                              f"skiplock needs {max(known)}: run `skiplock migrate`")

    # ---- producing -----------------------------------------------------------------------------

    def _enqueue_on(self, conn: Any, jobs: Sequence[NewJob]) -> list[int]:
        ids: list[int] = []
        chunk = ENQUEUE_CHUNK if self._autoinc_consecutive else 1
        with conn.cursor() as cur:
            for start in range(0, len(jobs), chunk):
                part = jobs[start:start + chunk]
                sql = self.q["enqueue_many"].replace("{rows}", ", ".join([self.q["enqueue_row"]] * len(part)))
                params: list[Any] = []
                for j in part:
                    params += [j.queue, j.task, j.args_json, j.priority, j.max_attempts, _naive_utc(j.run_at)]
                cur.execute(sql, params)
                first = int(cur.lastrowid)
                ids += range(first, first + len(part))
        return ids

    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        """Insert ``jobs``; ids in input order. On ``conn`` (the caller's PyMySQL connection): in its
        transaction, not committed here (the jobs exist only if it commits)."""
        if not jobs:
            return []
        if conn is not None:
            with translated(self.dsn):
                return self._enqueue_on(conn, jobs)
        with self._transaction() as c:
            return self._enqueue_on(c, jobs)

    def _unique_on(self, conn: Any, job: NewJob, unique_key: str) -> tuple[int, bool]:
        with conn.cursor() as cur:
            cur.execute(self.q["enqueue_unique"], {
                "queue": job.queue, "task": job.task, "args": job.args_json, "priority": job.priority,
                "max_attempts": job.max_attempts, "run_at": _naive_utc(job.run_at), "unique_key": unique_key})
            if cur.rowcount == 1:
                return int(cur.lastrowid), True
            cur.execute(self.q["unique_key_holder"], {"unique_key": unique_key})
            row = cur.fetchone()
        if row is None:  # the holder finished between the two statements: try again
            return self._unique_on(conn, job, unique_key)
        return int(row[0]), False

    def enqueue_unique(self, job: NewJob, unique_key: str, conn: Any = None) -> tuple[int, bool]:
        """(id, inserted): the active job holding ``unique_key``, inserted now or already there. A
        concurrent enqueue of the same key waits on the unique index entry until the first commits
        or rolls back (InnoDB's duplicate-key check), so one active job per key."""
        if conn is not None:
            with translated(self.dsn):
                return self._unique_on(conn, job, unique_key)
        with self._transaction() as c:
            return self._unique_on(c, job, unique_key)

    def unique_key_holder(self, unique_key: str) -> tuple[int, str] | None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["unique_key_holder"], {"unique_key": unique_key})
            row = cur.fetchone()
        return None if row is None else (int(row[0]), row[1])

    def enqueue_keyed(self, batch: Any, conn: Any = None) -> list[int]:
        raise NotImplementedError(f"enqueue_keyed is {NOT_YET}")

    def keyed_batch(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]) -> Any:
        raise NotImplementedError(f"keyed_batch is {NOT_YET}")

    # The statement steps (App.enqueue's protocol, see backend/postgres/steps.py): what a step is is
    # the backend's own business. A MySQL step is an _OnConn -- a function of the connection, since
    # ids come from LAST_INSERT_ID() rather than rows a statement returns -- run by ``run``.

    def enqueue_steps(self, jobs: Sequence[NewJob]) -> Generator[Any, Any, list[int]]:
        ids: list[int] = yield _OnConn(lambda c: self._enqueue_on(c, jobs))
        return ids

    def enqueue_unique_steps(self, job: NewJob, unique_key: str) -> Generator[Any, Any, tuple[int, bool]]:
        found: tuple[int, bool] = yield _OnConn(lambda c: self._unique_on(c, job, unique_key))
        return found

    def enqueue_keyed_steps(self, batch: Any) -> Generator[Any, Any, list[int]]:
        raise NotImplementedError(f"enqueue_many with unique keys is {NOT_YET}")

    def run(self, steps: Generator[Any, Any, T], conn: Any = None) -> T:
        """Run steps on ``conn`` (the caller's PyMySQL connection, in its transaction), else in a
        pooled transaction committed at the end. Only skiplock errors leave (and the steps' own)."""
        if conn is not None:
            with self._on(conn) as raw:
                return _drive(raw, steps)
        with self._transaction() as c:
            return _drive(c, steps)

    async def run_async(self, steps: Generator[Any, Any, T], conn: Any) -> T:
        raise NotImplementedError(f"AsyncApp is {NOT_YET}")

    # ---- the transaction lease -----------------------------------------------------------------

    def _raw(self, conn: Any) -> Any:
        return getattr(conn, "conn", conn)

    @contextmanager
    def _on(self, conn: Any) -> Iterator[Any]:
        """Run on ``conn`` (a Lease, a Session or the caller's connection) with driver errors raised as
        skiplock's; a statement refused on a lease marks it ``in_error`` until its rollback."""
        try:
            yield self._raw(conn)
        except pymysql.err.MySQLError as exc:
            error = translate(exc, self.dsn)
            if isinstance(conn, MySQLLease) and not connection_lost(exc):
                conn.refused = True
            raise error from None

    def claim(self, conn: Any, queues: Sequence[str] | None, limit: int = 1, savepoint: bool = False,
              tasks: Sequence[str] | None = None) -> list[ClaimedJob]:
        """Lock up to ``limit`` available jobs in the lease's transaction (see ``claim`` in
        queries.sql). A deadlock (1213: InnoDB rolled the transaction back) or a lock wait timeout
        (1205: only the statement) rolls the attempt back and retries, up to CLAIM_RETRIES times
        with jitter; then the last one is raised as DatabaseError. With ``savepoint``, the first
        job's SAVEPOINT follows."""
        raw = self._raw(conn)
        if queues and len(queues) == 1:
            query = self.q["claim" if tasks is None else "claim_tasks"]
            params: dict[str, Any] = {"queue": queues[0], "limit": limit}
            if tasks is not None:
                params["tasks"] = list(tasks) or [""]
        else:
            query = self.q["claim_any_queue"]
            params = {"all_queues": 0 if queues else 1, "queues": list(queues) if queues else [""],
                      "all_tasks": 0 if tasks is not None else 1, "tasks": list(tasks) if tasks else [""],
                      "limit": limit}
        for attempt in range(CLAIM_RETRIES):
            try:
                with raw.cursor() as cur:
                    cur.execute(query, params)
                    rows = cur.fetchall()
                    if savepoint:
                        cur.execute(self.q["savepoint"])
                return [_claimed(r) for r in rows]
            except pymysql.err.MySQLError as exc:
                if code(exc) not in RETRYABLE or attempt == CLAIM_RETRIES - 1:
                    if isinstance(conn, MySQLLease) and not connection_lost(exc):
                        conn.refused = True
                    raise translate(exc, self.dsn) from None
                try:
                    raw.rollback()
                except pymysql.err.MySQLError as again:
                    raise translate(again, self.dsn) from None
                time.sleep(random.uniform(0, 0.01 * 2 ** attempt))
        return []

    def start_attempt(self, conn: Any, job: ClaimedJob, worker: str, lease_pid: int | None,
                      exclusive: bool = True, batch: int | None = None) -> tuple[int, str | None, str | None, bool]:
        """Count the attempt on the bookkeeping session (see ``start_attempt`` in queries.sql).
        Returns (attempt, cancellation reason or None, None -- pending errors are not kept on MySQL
        yet --, suspect)."""
        params = {"id": job.id, "attempts": job.attempts, "worker": worker, "backend_pid": lease_pid,
                  "exclusive": bool(exclusive)}
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["start_attempt"], params)
            cur.execute(self.q["attempt_started"], {"id": job.id})
            started, reason, suspect = cur.fetchone()
        return int(started), reason, None, bool(suspect)

    def mark_exclusive(self, conn: Any, job_id: int, attempt: int) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["mark_exclusive"], {"id": job_id, "attempt": attempt})

    def start_batch(self, conn: Any, jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]:
        raise NotImplementedError(f"batches are {NOT_YET} (capabilities.batched_claims is False)")

    def forget_dead_batches(self, conn: Any, job_id: int, batch: int) -> None:
        raise NotImplementedError(f"batches are {NOT_YET}")

    def complete_batch(self, conn: Any, batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]:
        raise NotImplementedError(f"batches are {NOT_YET}")

    def savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["savepoint"])

    def rollback_to_savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["rollback_to_savepoint"])

    def release_savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["release_savepoint"])

    def set_local_timeouts(self, conn: Any, seconds: float) -> None:
        """Nothing: the server cannot bound a transaction's duration (the watchdog does)."""

    def _complete_on(self, raw: Any, job: ClaimedJob, attempt: int, result_json: str | None,
                     started_at: datetime, worker: str, owner: uuid.UUID | None) -> bool:
        with raw.cursor() as cur:
            cur.execute(self.q["complete"], {"id": job.id, "attempt": attempt, "result": result_json,
                                             "started_at": _naive_utc(started_at), "worker": worker,
                                             "owner": None if owner is None else str(owner)})
            done = cur.rowcount == 1
            if done:
                cur.execute(self.q["forget_attempts"], {"id": job.id})
        return done

    def complete(self, conn: Any, job: ClaimedJob, attempt: int, result_json: str | None, started_at: datetime,
                 worker: str, owner: uuid.UUID | None = None) -> bool:
        """Write ``done`` in the lease (guarded: see ``complete`` in queries.sql); False if refused.
        ``conn`` None: a pooled transaction, committed at once."""
        if conn is None:
            with self._transaction() as c:
                return self._complete_on(c, job, attempt, result_json, started_at, worker, owner)
        with self._on(conn) as raw:
            return self._complete_on(raw, job, attempt, result_json, started_at, worker, owner)

    def _outcome_on(self, raw: Any, job: ClaimedJob, attempt: int, state: str, delay: float | None,
                    error: str | None, started_at: datetime, worker: str, uncount: bool) -> str | None:
        with raw.cursor() as cur:
            cur.execute(self.q["lock_for_outcome"], {"id": job.id})
            if cur.fetchone() is None:
                return None  # not ours: locked by another session, or already finished
            cur.execute(self.q["cancellation_reason"], {"id": job.id})
            row = cur.fetchone()
            written = "cancelled" if row is not None else state
            last_error = f"cancelled: {row[0]}" if row is not None else error
            cur.execute(self.q["record_outcome"], {
                "id": job.id, "state": written, "attempt": attempt, "delay": delay,
                "delay_us": int((delay or 0) * 1_000_000), "started_at": _naive_utc(started_at),
                "last_error": last_error, "error": error, "worker": worker})
            if written != "queued":
                cur.execute(self.q["forget_attempts"], {"id": job.id})
                cur.execute(self.q["forget_cancellation"], {"id": job.id})
            elif uncount:
                cur.execute(self.q["uncount_attempt"], {"id": job.id})
        return written

    def record_outcome(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str, delay: float | None,
                       error: str | None, started_at: datetime, worker: str, uncount: bool = False,
                       owner: uuid.UUID | None = None) -> str | None:
        """Write a retry/failed/cancelled outcome; the state written, or None if the row was not ours
        (from a fresh transaction: still locked by another session -- skipped, never waited on)."""
        if owner is not None:
            raise NotImplementedError(f"the claimed lease is {NOT_YET}")
        if conn is None:
            with self._transaction() as c:
                return self._outcome_on(c, job, attempt, state, delay, error, started_at, worker, uncount)
        with self._on(conn) as raw:
            return self._outcome_on(raw, job, attempt, state, delay, error, started_at, worker, uncount)

    def terminate(self, backend_pids: Sequence[int]) -> None:
        """KILL these sessions (their transactions roll back) and wait (up to 5 s) until they are gone."""
        if not backend_pids:
            return
        with self._conn() as c, c.cursor() as cur:
            for pid in backend_pids:
                try:
                    cur.execute("KILL CONNECTION %s", (int(pid),))
                except pymysql.err.OperationalError as exc:
                    if code(exc) != 1094:  # unknown thread id: already gone
                        raise
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN %s",
                            (list(int(p) for p in backend_pids),))
                if cur.fetchone()[0] == 0:
                    return
                time.sleep(0.01)

    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The worker's one finishing write (base.Finish); raises only skiplock errors."""
        if what.via is Via.BATCH_COMMIT:
            raise NotImplementedError(f"batches are {NOT_YET}")
        (w,) = what.writes
        conn = None if lease is None or what.via is Via.FRESH else lease.conn
        if w.state == "done":
            done = self.complete(conn, w.job, w.attempt, w.result, w.started_at, w.worker, w.owner)
            return {w.job.id: "done"} if done else {}
        if w.undo and conn is not None:
            self.rollback_to_savepoint(conn)
        state = self.record_outcome(conn, w.job, w.attempt, state=w.state, delay=w.delay, error=w.error,
                                    started_at=w.started_at, worker=w.worker, uncount=w.uncount, owner=w.owner)
        return {} if state is None else {w.job.id: state}

    # ---- lifecycle -----------------------------------------------------------------------------

    def request_cancel(self, job_id: int, reason: str) -> str | None:
        """Record the request; returns the job's state (None: no such job)."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["request_cancel"], {"id": job_id, "reason": reason})
            cur.execute(self.q["job_state"], {"id": job_id})
            row = cur.fetchone()
        return None if row is None else row[0]

    def cancel_if_unlocked(self, job_id: int) -> bool:
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["cancel_if_unlocked"], {"id": job_id})
            if cur.fetchone() is None:
                return False
            cur.execute(self.q["cancel_now"], {"id": job_id})
            done = cur.rowcount == 1
            if done:
                cur.execute(self.q["forget_cancellation"], {"id": job_id})
                cur.execute(self.q["forget_attempts"], {"id": job_id})
        return done

    def forget_cancel_request(self, job_id: int) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["forget_cancellation"], {"id": job_id})

    def retry_job(self, job_id: int) -> bool:
        """Queue a failed/cancelled job again; False if it is not one, or its unique key is held."""
        try:
            with self._transaction() as c, c.cursor() as cur:
                cur.execute(self.q["retry_job"], {"id": job_id})
                return cur.rowcount == 1
        except Exception as exc:  # noqa: BLE001 - translated: 1062, the key is held
            if getattr(exc, "sqlstate", None) == "1062":
                return False
            raise

    def queue_known(self, queue: str) -> bool:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["queue_known"], {"queue": queue})
            return bool(cur.fetchone()[0])

    def pause_queue(self, queue: str) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["pause_queue"], {"queue": queue})

    def resume_queue(self, queue: str) -> bool:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["resume_queue"], {"queue": queue})
            return cur.rowcount == 1

    def paused_queues(self) -> list[str]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["paused_queues"])
            return [r[0] for r in cur.fetchall()]

    def prune(self, state: str, age_seconds: float, batch: int) -> int | None:
        """Delete up to ``batch`` finished jobs of ``state`` older than ``age_seconds``; the count."""
        if state not in ("done", "failed", "cancelled"):
            raise ValueError(f"prune: {state!r} is not a finished state")
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["prune"], {"state": state, "age_us": int(age_seconds * 1_000_000), "batch": batch})
            return int(cur.rowcount)

    # ---- reading -------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["get_job"], {"id": job_id})
            row = cur.fetchone()
        return None if row is None else _job(row)

    def list_jobs(self, *, state: str | None = None, queue: str | None = None, task: str | None = None,
                  limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["list_jobs"], {"state": state, "queue": queue, "task": task, "limit": limit,
                                              "before": before})
            return [_job(r) for r in cur.fetchall()]

    def counts(self) -> list[tuple[str, str, int]]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["counts"])
            return [(r[0], r[1], int(r[2])) for r in cur.fetchall()]

    # ---- workers (worker/presence.py) and the rescuer -----------------------------------------

    def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None, *,
                    host: str | None = None, pid: int | None = None, concurrency: int | None = None) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["forget_stale_workers"], {"id": str(worker_id)})
            cur.execute(self.q["worker_seen"], {
                "id": str(worker_id), "name": name, "tasks": json.dumps(list(tasks)),
                "queues": None if queues is None else json.dumps(list(queues)), "host": host, "pid": pid,
                "concurrency": concurrency})

    def worker_gone(self, worker_id: uuid.UUID) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["worker_gone"], {"id": str(worker_id)})

    def live_workers(self, live_seconds: float) -> int:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["live_workers"], {"live_us": int(live_seconds * 1_000_000)})
            return int(cur.fetchone()[0])

    def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]:
        """Claimed leases that expired: queued again, or failed after their last attempt; [(id, state)]."""
        out: list[tuple[int, str]] = []
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["expired_leases"], {"batch": batch})
            for job_id, attempts, max_attempts in cur.fetchall():
                state = "failed" if attempts >= max_attempts else "queued"
                cur.execute(self.q["rescue_one"], {"id": job_id, "state": state})
                if cur.rowcount == 1:
                    out.append((int(job_id), state))
                    if state == "failed":
                        cur.execute(self.q["forget_attempts"], {"id": job_id})
        return out

    def testing(self) -> Any:
        raise NotImplementedError(f"skiplock.testing is {NOT_YET}")

    def outbox_store(self) -> Any:
        raise NotImplementedError(f"the outbox is {NOT_YET}")


def _not_yet(name: str) -> Any:
    import inspect

    from ..base import Backend

    def verb(self: MySQLBackend, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} is {NOT_YET}")
    verb.__name__ = name
    verb.__signature__ = inspect.signature(getattr(Backend, name))  # type: ignore[attr-defined]
    verb.__doc__ = f"Not yet on MySQL/MariaDB (issue 12): raises NotImplementedError."
    return verb


# The port's verbs this slice does not implement yet (docs/mysql.md lists them): present, so the
# backend satisfies the port's shape, and each says so when called.
NOT_IMPLEMENTED = ("start_claimed", "heartbeat", "cancel_running", "end_lease_holder",
                   "retry_failed", "add_waiter", "remove_waiter", "jobs_vacuum_threshold", "enqueue_tick",
                   "last_tick", "prune_ticks", "untakeable",
                   "running_now", "batches_in_flight", "live_worker_rows", "failure_classes", "oldest_ready")
for _name in NOT_IMPLEMENTED:
    setattr(MySQLBackend, _name, _not_yet(_name))
