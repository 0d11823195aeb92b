"""MySQL/MariaDB connections: every session at READ COMMITTED in UTC with a short lock wait, the
start-up checks (binlog format, auto-increment mode), the pool, leases and bookkeeping sessions."""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pymysql

from ...errors import ConfigurationError, DatabaseUnavailable, redact_dsn
from ..base import Capabilities
from .dsn import connect_args
from .errors import code, connection_lost, translate, translated
from .lease import MySQLLease, MySQLSession
from .sql import LOCK_WAIT_SECONDS, _load, _named, names

if TYPE_CHECKING:
    from .notifications import MySQLNotifications

log = logging.getLogger("skiplock.mysql")


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


class MySQLConnections:
    """The MySQL backend's connections (a small pool, lease and bookkeeping sessions) and the
    start-up checks; the verbs live in mixins (producing.py, leasing.py, operating.py) that
    backend.py assembles. Nothing connects before first use."""

    wake_payload = "wake"
    capabilities = Capabilities(batched_claims=True, listen_notify=True, server_bounds_lease=False)

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
        return f"{type(self).__name__}({redact_dsn(self.dsn)!r}, schema={self.schema!r})"

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
            if self._idle_transaction_timeout:
                # Every session of skiplock's, pooled ones too: no transaction of a frozen process (a
                # rescuer's, an enqueue's) keeps its row locks past lease_timeout (docs/mysql.md).
                with translated(self.dsn), conn.cursor() as cur:
                    cur.execute("SET SESSION idle_transaction_timeout = %s", (max(1, int(self.lease_timeout)),))
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
        return MySQLLease(self._connect(autocommit=False), self)

    def connect_bookkeeping(self) -> MySQLSession:
        return MySQLSession(self._connect(autocommit=True), self.dsn)

    def connect_listener(self) -> "MySQLNotifications":
        """An autocommit session polling for wake-ups (notifications.py: no LISTEN/NOTIFY on MySQL)."""
        from .notifications import MySQLNotifications

        conn = self._connect(autocommit=True)
        try:
            return MySQLNotifications(conn, self)
        except BaseException:
            conn.close()
            raise

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

    # ---- what every finishing write does after it (leasing.py, operating.py) -------------------

    def notice(self, job_id: int) -> str:
        """The payload announcing that a job finished (a notice row, see ``notify`` in queries.sql)."""
        return f"{self.schema}:{job_id}"

    def _finishing_rows(self, cur: Any, ids: Sequence[int]) -> dict[int, tuple[bool, list[Any] | None, bool]]:
        """{job id: (has an attempt row, pending errors, waited on)}, the attempt rows locked (see
        ``finishing_rows`` in queries.sql)."""
        cur.execute(self.q["finishing_rows"], {"ids": list(ids)})
        return {int(r[0]): (bool(r[1]), None if r[2] is None else json.loads(r[2]), bool(r[3]))
                for r in cur.fetchall()}

    def _after_finish(self, cur: Any, ids: Sequence[int], *, pending_last_error: bool = True) -> None:
        """Once ``ids`` are written finished: their pending errors folded in, their attempt rows
        gone, their waiters notified -- in the finishing write's transaction. ``pending_last_error``:
        the last pending error becomes last_error (not for a cancellation: its reason stays)."""
        rows = self._finishing_rows(cur, ids)
        for job_id, (_, pending, _) in rows.items():
            if pending:
                cur.execute(self.q["fold_pending"], {"id": job_id, "pending": json.dumps(pending),
                                                      "pending_last": pending[-1].get("error") if pending_last_error else None})
        counted = [i for i, (has, _, _) in rows.items() if has]
        if counted:
            cur.execute(self.q["forget_attempts_of"], {"ids": counted})
        self._notify(cur, [i for i, (_, _, waited) in rows.items() if waited])

    def _notify(self, cur: Any, ids: Sequence[int]) -> None:
        """A notice per job (its waiters' wake-up), visible when the caller's transaction commits."""
        if ids:
            cur.execute(self.q["notify"].replace("{rows}", ", ".join([self.q["notify_row"]] * len(ids))),
                        [self.notice(i) for i in ids])

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
