"""What a conformance test needs beyond the backend's verbs, per backend: the :class:`Subject`.

Its methods are the operations of the coming ``Lease`` (issue 11, item 2) and listener that the port
(backend/base.py) does not declare yet -- commit, rollback, the session id, "end this session",
"what notifications arrived" -- plus two things only a test does: end a session from outside (an
operator's kill, a crash) and make time pass for a finished job (``age_finished``). Each backend
implements them once, here; the tests are the same for every backend. See README.md for the list of
verbs the port must grow.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime
from typing import Any, Callable, Sequence

from skiplock.backend.base import ClaimedJob, NewJob

WORKER = "conformance-host:1/0"  # a slot name as a worker writes it (host:pid/slot)


def new_job(task: str = "t", *, queue: str = "default", priority: int = 0, max_attempts: int = 3,
            run_at: datetime | None = None, args: dict[str, Any] | None = None) -> NewJob:
    return NewJob(task, json.dumps(args or {}), queue, priority, max_attempts, run_at)


class Subject:
    """A backend under test and the test-side operations on its connections (see the module doc)."""

    backend: Any

    def __init__(self) -> None:
        self._opened: list[Any] = []

    # ---- connections (opened through the backend's verbs where it has them) -------------------

    def lease(self) -> Any:
        """A lease connection (``connect_lease``) as a worker slot opens it."""
        return self._keep(self.backend.connect_lease("skiplock-worker conformance"))

    def bookkeeping(self) -> Any:
        """An attempt-counting connection (``connect_bookkeeping``)."""
        return self._keep(self.backend.connect_bookkeeping())

    def listener(self) -> Any:
        """A listening connection (``connect_listener``)."""
        return self._keep(self.backend.connect_listener())

    def _keep(self, conn: Any) -> Any:
        self._opened.append(conn)
        return conn

    def close(self) -> None:
        for conn in self._opened:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a killed session may refuse even that
                pass
        self.backend.close()

    # ---- what the port must grow (README.md); one implementation per backend -----------------

    def producer(self) -> Any:
        """The caller's own connection, in a transaction (for ``enqueue(..., conn=)``)."""
        raise NotImplementedError

    def commit(self, conn: Any) -> None:
        raise NotImplementedError

    def rollback(self, conn: Any) -> None:
        raise NotImplementedError

    def session(self, conn: Any) -> int:
        """The server's id of the connection's session (the lease pid start_attempt records)."""
        raise NotImplementedError

    def never_wait(self, conn: Any) -> None:
        """From now on a statement on ``conn`` that would wait on a lock fails instead (so "without
        waiting" is something a test can see fail, not a hang)."""
        raise NotImplementedError

    def waiting(self, conn: Any) -> bool:
        """Whether the connection's session is waiting on a lock now (to know two calls overlap)."""
        raise NotImplementedError

    def kill(self, conn: Any) -> None:
        """End the connection's session from outside (an operator, a crash) and return once the server
        has ended it (its transaction rolled back, its locks released)."""
        raise NotImplementedError

    def woken(self, listener: Any, payload: str, timeout: float = 10.0) -> bool:
        """True once a notification with ``payload`` arrives on ``listener``; False after ``timeout``
        (a safety net, never a speed assertion). Through the port's ``Notifications.wait``: the same
        for every backend that has LISTEN/NOTIFY."""
        seen = self._seen.setdefault(id(listener), set())  # notifications read while waiting for another
        deadline = time.monotonic() + timeout
        while payload not in seen and (left := deadline - time.monotonic()) > 0:
            seen.update(listener.wait(min(left, 0.5)))  # the port's Notifications
        return payload in seen

    def notice(self, job_id: int) -> str:
        """The payload announcing that a job finished."""
        return str(self.backend.notice(job_id))

    def database_default_isolation(self, level: str) -> None:
        """Make ``level`` ("repeatable read", "serializable") the database's default for new sessions,
        as a DBA might (skiplock's sessions must not inherit it)."""
        raise NotImplementedError

    def age_finished(self, job_id: int, seconds: float) -> None:
        """The test-side clock: the job finished ``seconds`` earlier than it did."""
        raise NotImplementedError

    # ---- shorthands over the verbs --------------------------------------------------------------

    def claim(self, conn: Any, queues: Sequence[str] | None = ("default",), **kw: Any) -> list[ClaimedJob]:
        return self.backend.claim(conn, list(queues) if queues is not None else None, **kw)

    def claim_one(self, conn: Any, queues: Sequence[str] | None = ("default",)) -> ClaimedJob | None:
        jobs = self.claim(conn, queues)
        return jobs[0] if jobs else None

    def state(self, job_id: int) -> str | None:
        row = self.backend.get_job(job_id)
        return None if row is None else row["state"]

    def job(self, job_id: int) -> dict[str, Any]:
        row = self.backend.get_job(job_id)
        assert row is not None, f"job {job_id} does not exist"
        return row

    def start_attempt(self, book: Any, lease: Any, job: ClaimedJob, exclusive: bool = True) -> tuple[Any, ...]:
        return self.backend.start_attempt(book, job, WORKER, self.session(lease), exclusive)

    def complete(self, conn: Any, job: ClaimedJob, attempt: int, owner: uuid.UUID | None = None,
                 result: str | None = None) -> bool:
        return self.backend.complete(conn, job, attempt, result, job.claimed_at, WORKER, owner)

    def record(self, conn: Any, job: ClaimedJob, attempt: int, state: str, error: str | None = "E: boom",
               delay: float | None = None, owner: uuid.UUID | None = None, uncount: bool = False) -> str | None:
        return self.backend.record_outcome(conn, job, attempt, state=state, delay=delay, error=error,
                                           started_at=job.claimed_at, worker=WORKER, uncount=uncount, owner=owner)


class PostgresSubject(Subject):
    """PostgreSQL through psycopg; ``admin_dsn`` is a superuser's, for ending sessions from outside."""

    def __init__(self, backend: Any, dsn: str, admin_dsn: str):
        super().__init__()
        self.backend = backend
        self.dsn = dsn
        self.admin_dsn = admin_dsn
        self._seen: dict[int, set[str]] = {}

    def producer(self) -> Any:
        import psycopg

        return self._keep(psycopg.connect(self.dsn))

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def session(self, conn: Any) -> int:
        if hasattr(conn, "session_id"):  # a backend session (Lease): its own id
            return int(conn.session_id)
        return int(conn.info.backend_pid)

    def never_wait(self, conn: Any) -> None:
        raw = getattr(conn, "conn", conn)  # a Lease's driver connection (job.conn)
        raw.execute("SET lock_timeout = '2s'")
        raw.commit()

    def kill(self, conn: Any) -> None:
        import psycopg

        pid = self.session(conn)
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0], f"no session {pid}"
            _until(lambda: admin.execute("SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)",
                                         [pid]).fetchone()[0], f"session {pid} to end")

    def waiting(self, conn: Any) -> bool:
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            return bool(admin.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s "
                                      "AND wait_event_type = 'Lock')", [self.session(conn)]).fetchone()[0])


    def database_default_isolation(self, level: str) -> None:
        import psycopg
        from psycopg import conninfo, sql

        name = conninfo.conninfo_to_dict(self.dsn)["dbname"]
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                sql.Identifier(name), sql.Literal(level)))

    def age_finished(self, job_id: int, seconds: float) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(sql.SQL("UPDATE {}.jobs SET finished_at = finished_at - %s * interval '1 second' "
                              "WHERE id = %s").format(sql.Identifier(self.backend.schema)), [seconds, job_id])


def _until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    from support import wait_for

    return wait_for(condition, timeout=timeout, what=what)


def in_thread(fn: Callable[[], Any]) -> Callable[[float], Any]:
    """Run ``fn`` in a thread; returns ``join(timeout)`` giving its result (or raising its error)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join(timeout: float = 30.0) -> Any:
        thread.join(timeout)
        assert not thread.is_alive(), "the call did not return (a safety net, not a speed assertion)"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


class MariaDBSubject(Subject):
    """MySQL/MariaDB through PyMySQL (the private MariaDB of tests/mariadb_server.py); ``server`` has
    every privilege, for ending sessions from outside (KILL) and server-wide defaults."""

    def __init__(self, backend: Any, dsn: str, server: Any):
        super().__init__()
        self.backend = backend
        self.dsn = dsn
        self.server = server
        self._seen: dict[int, set[str]] = {}
        self._isolation_changed = False

    def _admin(self) -> Any:
        return self.server.connect()

    def producer(self) -> Any:
        import pymysql

        from skiplock.backend.mysql.dsn import connect_args

        return self._keep(pymysql.connect(**connect_args(self.dsn), autocommit=False))

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def session(self, conn: Any) -> int:
        if hasattr(conn, "session_id"):  # a backend session (Lease): its own id
            return int(conn.session_id)
        return int(conn.thread_id())

    def never_wait(self, conn: Any) -> None:
        raw = getattr(conn, "conn", conn)  # a Lease's driver connection (job.conn)
        with raw.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")  # MySQL's shortest: 1 s, then 1205

    def kill(self, conn: Any) -> None:
        sid = self.session(conn)
        with self._admin() as admin, admin.cursor() as cur:
            cur.execute("KILL CONNECTION %s", (sid,))

            def gone() -> bool:
                cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (sid,))
                return cur.fetchone()[0] == 0

            _until(gone, f"session {sid} to end")

    def waiting(self, conn: Any) -> bool:
        with self._admin() as admin, admin.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                        "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'", (self.session(conn),))
            return bool(cur.fetchone()[0])

    def database_default_isolation(self, level: str) -> None:
        """MySQL has no per-database default: the server's (GLOBAL) one, restored at close."""
        with self._admin() as admin, admin.cursor() as cur:
            cur.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL " + {"repeatable read": "REPEATABLE READ",
                                                                   "serializable": "SERIALIZABLE"}[level])
        self._isolation_changed = True

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._isolation_changed:
                with self._admin() as admin, admin.cursor() as cur:
                    cur.execute("SET GLOBAL TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # the server's default

    def age_finished(self, job_id: int, seconds: float) -> None:
        with self.server.connect(self.dsn.rsplit("/", 1)[1]) as c, c.cursor() as cur:
            cur.execute(f"UPDATE {self.backend.tables['jobs']} SET finished_at = finished_at - INTERVAL %s MICROSECOND "
                        "WHERE id = %s", (int(seconds * 1_000_000), job_id))
