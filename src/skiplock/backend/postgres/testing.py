"""What :mod:`skiplock.testing` does on the database, for PostgreSQL: a connection whose transaction
is rolled back at the end, and the statements ``run_inline`` and ``assert_enqueued`` run on it
(testing.sql). Reached through :meth:`PostgresBackend.testing`."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterator

import psycopg
from psycopg.rows import dict_row

from .queries import load_queries

if TYPE_CHECKING:
    from .backend import PostgresBackend


class PostgresTesting:
    def __init__(self, backend: "PostgresBackend", connect: Callable[[str], psycopg.Connection[Any]]):
        """``connect(application_name)``: a new connection, not autocommit, READ COMMITTED."""
        self.backend = backend
        self._connect = connect
        self.q = load_queries(backend.schema, "testing.sql")

    @contextmanager
    def rolled_back(self, application_name: str) -> Iterator[psycopg.Connection[Any]]:
        """A new connection (READ COMMITTED, like skiplock's own sessions) with a transaction open
        for the whole block, rolled back when it ends (also on error); ``conn.commit()`` inside it
        raises ``psycopg.ProgrammingError`` and ``conn.transaction()`` blocks are savepoints."""
        conn = self._connect(application_name)
        try:
            with conn.transaction(force_rollback=True):
                yield conn
        finally:
            conn.close()

    @staticmethod
    def check_connection(conn: Any, *, reading: bool = False) -> None:
        """TypeError unless ``conn`` is a sync psycopg connection; ValueError if it autocommits and
        will be written to (the writes would stay)."""
        if isinstance(conn, psycopg.AsyncConnection) or not isinstance(conn, psycopg.Connection):
            raise TypeError("conn must be a psycopg Connection (e.g. from skiplock.testing.rolled_back), "
                            f"got {type(conn).__name__}")
        if conn.autocommit and not reading:
            raise ValueError("conn is in autocommit mode: run_inline's writes would be committed; "
                             "use a transaction you roll back (skiplock.testing.rolled_back(app))")

    @staticmethod
    def savepoint(conn: psycopg.Connection[Any]) -> Any:
        """A block whose writes an exception undoes (a savepoint in conn's transaction)."""
        return conn.transaction()

    def job_row(self, conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
        """The job as ``conn``'s transaction sees it."""
        row: dict[str, Any] | None = conn.cursor(row_factory=dict_row).execute(
            self.backend.q["get_job"], {"id": job_id}).fetchone()
        return row

    def finish_inline(self, conn: psycopg.Connection[Any], job_id: int, started_at: datetime,
                      result_json: str | None, worker: str) -> None:
        conn.execute(self.q["finish_inline"], {"id": job_id, "started_at": started_at, "result": result_json,
                                               "worker": worker})

    def jobs_in_transaction(self, conn: psycopg.Connection[Any], state: str | None) -> list[dict[str, Any]]:
        """The jobs (in ``state``; None: any) ``conn``'s transaction sees, its own uncommitted ones included."""
        return conn.cursor(row_factory=dict_row).execute(self.q["jobs_in_transaction"], {"state": state}).fetchall()
