"""Producing jobs on MySQL/MariaDB: single, many (in chunks), unique; the statement steps."""

from __future__ import annotations

from typing import Any, Generator, Mapping, Sequence

from ...errors import DuplicateJob
from ..base import NewJob
from ..keyed import same_keys
from .connections import MySQLConnections
from .errors import translated
from .sql import ENQUEUE_CHUNK, NOT_YET, T, _OnConn, _drive, _naive_utc


class KeyedBatch:
    """An ``enqueue_many`` call in which some items carry a unique key (``keyed``: item index ->
    (unique_key, on_conflict)). Each key is sent once, with its first item; a later item with the
    same key gets that item's id -- or, with ``on_conflict="raise"``, is refused here, before any I/O
    (DuplicateJob with ``existing_id`` None), as on PostgreSQL."""

    def __init__(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]):
        self.jobs = jobs
        self.keyed = keyed
        self.same_as = same_keys(keyed)  # a later item -> the first item with its key
        self.sent = [i for i in range(len(jobs)) if i not in self.same_as]
        self.sent_keyed = [i for i in self.sent if i in keyed]


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

    def keyed_batch(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]) -> "KeyedBatch":
        """An ``enqueue_many`` batch with unique keys (:class:`KeyedBatch`; refuses in-call duplicates)."""
        return KeyedBatch(jobs, keyed)

    def enqueue_keyed(self, batch: "KeyedBatch", conn: Any = None) -> list[int]:
        """``enqueue_many`` with unique keys: ids in input order, an item whose key is held getting the
        holder's id; an item with ``on_conflict="raise"`` meeting a holder raises DuplicateJob and
        nothing of the call is left (see :meth:`_keyed_on`)."""
        return self.run(self.enqueue_keyed_steps(batch), conn)

    def _keyed_on(self, conn: Any, batch: "KeyedBatch") -> list[int]:
        """One SAVEPOINT around the call (a BEGIN/COMMIT if ``conn`` is in autocommit): keyed items
        inserted one by one in key order (INSERT IGNORE, the holder read back: ``_unique_on``) -- so
        concurrent batches sharing keys wait on each other in the same order and never deadlock --,
        then the others in one multi-row INSERT. A refusal rolls back to the savepoint. The ids are
        therefore not ascending in input order when keys are involved (they are on PostgreSQL)."""
        own = bool(conn.get_autocommit())
        if own:
            conn.begin()
        with conn.cursor() as cur:
            cur.execute(self.q["keyed_savepoint"])
        try:
            found: dict[int, int] = {}
            for i in sorted(batch.sent_keyed, key=lambda i: batch.keyed[i][0].encode()):
                key, on_conflict = batch.keyed[i]
                job_id, created = self._unique_on(conn, batch.jobs[i], key)
                if not created and on_conflict == "raise":
                    raise DuplicateJob(f"item {i}: job {job_id} already holds unique_key {key!r}; "
                                       "nothing was enqueued", job_id)
                found[i] = job_id
            plain = [i for i in batch.sent if i not in batch.keyed]
            for i, job_id in zip(plain, self._enqueue_on(conn, [batch.jobs[i] for i in plain])):
                found[i] = job_id
        except BaseException:
            with conn.cursor() as cur:
                cur.execute(self.q["keyed_rollback"])
            if own:
                conn.rollback()
            raise
        with conn.cursor() as cur:
            cur.execute(self.q["keyed_release"])
        if own:
            conn.commit()
        return [found[batch.same_as.get(i, i)] for i in range(len(batch.jobs))]

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
        ids: list[int] = yield _OnConn(lambda c: self._keyed_on(c, batch))
        return ids

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
