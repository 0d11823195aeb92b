"""What :mod:`skiplock.testing` does on the database, for MySQL/MariaDB: a connection whose
transaction is rolled back at the end, and the statements ``run_inline`` and ``assert_enqueued`` run
on it (``inline_*`` in queries.sql). Reached through :meth:`MySQLBackend.testing`."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterator

import pymysql

from .sql import _job, _naive_utc

if TYPE_CHECKING:
    from .connections import MySQLConnections


def _refuse_commit() -> None:
    raise pymysql.err.ProgrammingError("this connection's transaction is rolled back at the end of "
                                       "skiplock.testing.rolled_back: commit() is refused")


class MySQLTesting:
    def __init__(self, backend: "MySQLConnections"):
        self.backend = backend
        self.q = backend.q

    @contextmanager
    def rolled_back(self, application_name: str) -> Iterator[Any]:
        """A new PyMySQL connection (READ COMMITTED, UTC, like skiplock's own sessions) with a
        transaction open for the whole block, rolled back when it ends (also on error); its
        ``commit()`` raises ``pymysql.err.ProgrammingError``."""
        conn = self.backend._connect(autocommit=False)
        try:
            conn.begin()
            conn.commit = _refuse_commit  # nothing escapes the rollback
            yield conn
        finally:
            try:
                conn.rollback()
            finally:
                conn.close()

    @staticmethod
    def check_connection(conn: Any, *, reading: bool = False) -> None:
        """TypeError unless ``conn`` is a PyMySQL connection; ValueError if it autocommits and will be
        written to (the writes would stay)."""
        if not isinstance(conn, pymysql.connections.Connection):
            raise TypeError("conn must be a PyMySQL Connection (e.g. from skiplock.testing.rolled_back), "
                            f"got {type(conn).__name__}")
        if conn.get_autocommit() and not reading:
            raise ValueError("conn is in autocommit mode: run_inline's writes would be committed; "
                             "use a transaction you roll back (skiplock.testing.rolled_back(app))")

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        """A block whose writes an exception undoes (a savepoint in conn's transaction)."""
        with conn.cursor() as cur:
            cur.execute(self.q["inline_savepoint"])
        try:
            yield
        except BaseException:
            with conn.cursor() as cur:
                cur.execute(self.q["inline_rollback"])
            raise
        with conn.cursor() as cur:
            cur.execute(self.q["inline_release"])

    def job_row(self, conn: Any, job_id: int) -> dict[str, Any] | None:
        """The job as ``conn``'s transaction sees it."""
        with conn.cursor() as cur:
            cur.execute(self.q["get_job"], {"id": job_id})
            row = cur.fetchone()
        return None if row is None else _job(row)

    def finish_inline(self, conn: Any, job_id: int, started_at: datetime, result_json: str | None,
                      worker: str) -> None:
        with conn.cursor() as cur:
            cur.execute(self.q["inline_finish"], {"id": job_id, "started_at": _naive_utc(started_at),
                                                  "result": result_json, "worker": worker})

    def jobs_in_transaction(self, conn: Any, state: str | None) -> list[dict[str, Any]]:
        """The jobs (in ``state``; None: any) ``conn``'s transaction sees, its own uncommitted ones included."""
        with conn.cursor() as cur:
            cur.execute(self.q["inline_jobs"], {"state": state})
            return [_job(r) for r in cur.fetchall()]
