"""Producing jobs on MySQL/MariaDB: single, many (in chunks), unique; the statement steps."""

from __future__ import annotations

from typing import Any, Generator, Mapping, Sequence

from ..base import NewJob
from .connections import MySQLConnections
from .errors import translated
from .sql import ENQUEUE_CHUNK, NOT_YET, T, _OnConn, _drive, _naive_utc


class Producing(MySQLConnections):
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
