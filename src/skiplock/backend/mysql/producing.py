"""Producing jobs on MySQL/MariaDB: single, many (in chunks), unique; written once as statement
steps (steps.py), run on PyMySQL (``run``) and on the caller's asyncio connection (``run_async``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...errors import ConfigurationError, DuplicateJob
from ..base import NewJob
from ..keyed import same_keys
from .connections import MySQLConnections
from .errors import connection_lost, translate
from .lease import MySQLLease
from .sql import ENQUEUE_CHUNK, T, _naive_utc
from .steps import OWN_TRANSACTION, Statement, Steps, run, run_async, undo


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
        """``enqueue_steps`` on a PyMySQL connection of the backend's own (operating.py's tick)."""
        return self.run(self.enqueue_steps(jobs), conn)

    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        """Insert ``jobs``; ids in input order. On ``conn`` (the caller's PyMySQL connection): in its
        transaction, not committed here (the jobs exist only if it commits); a connection in
        autocommit mode gets a transaction of its own for the call (all the jobs or none)."""
        if not jobs:
            return []
        return self.run(self.enqueue_steps(jobs), conn)

    def enqueue_unique(self, job: NewJob, unique_key: str, conn: Any = None) -> tuple[int, bool]:
        """(id, inserted): the active job holding ``unique_key``, inserted now or already there. A
        concurrent enqueue of the same key waits on the unique index entry until the first commits
        or rolls back (InnoDB's duplicate-key check), so one active job per key."""
        return self.run(self.enqueue_unique_steps(job, unique_key), conn)

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
        nothing of the call is left (see :meth:`enqueue_keyed_steps`)."""
        return self.run(self.enqueue_keyed_steps(batch), conn)

    # ---- the statement steps (steps.py): run by ``run`` (PyMySQL) and ``run_async`` (asyncio) ------

    def _insert_steps(self, jobs: Sequence[NewJob]) -> Steps[list[int]]:
        """Multi-row INSERTs of up to ENQUEUE_CHUNK jobs (one per statement where the server's
        auto-increment mode does not give a statement consecutive ids); ids from LAST_INSERT_ID()."""
        ids: list[int] = []
        chunk = ENQUEUE_CHUNK if self._autoinc_consecutive else 1
        for start in range(0, len(jobs), chunk):
            part = jobs[start:start + chunk]
            sql = self.q["enqueue_many"].replace("{rows}", ", ".join([self.q["enqueue_row"]] * len(part)))
            params: list[Any] = []
            for j in part:
                params += [j.queue, j.task, j.args_json, j.priority, j.max_attempts, _naive_utc(j.run_at)]
            first = int((yield Statement(sql, params)).lastrowid)
            ids += range(first, first + len(part))
        return ids

    def enqueue_steps(self, jobs: Sequence[NewJob]) -> Steps[list[int]]:
        """:meth:`_insert_steps`; more than one statement on a connection in autocommit mode runs in
        a transaction of its own, so the call is atomic there too."""
        many = len(jobs) > (ENQUEUE_CHUNK if self._autoinc_consecutive else 1)
        own = many and (yield OWN_TRANSACTION)
        if not own:
            return (yield from self._insert_steps(jobs))
        yield Statement("BEGIN")
        try:
            ids = yield from self._insert_steps(jobs)
        except Exception:
            yield from undo(Statement("ROLLBACK"))
            raise
        yield Statement("COMMIT")
        return ids

    def enqueue_unique_steps(self, job: NewJob, unique_key: str) -> Steps[tuple[int, bool]]:
        """INSERT IGNORE on the active key, then -- if it inserted nothing -- the holder read back; a
        holder finished between the two statements means trying again."""
        while True:
            inserted = yield Statement(self.q["enqueue_unique"], {
                "queue": job.queue, "task": job.task, "args": job.args_json, "priority": job.priority,
                "max_attempts": job.max_attempts, "run_at": _naive_utc(job.run_at), "unique_key": unique_key})
            if inserted.rowcount == 1:
                return int(inserted.lastrowid), True
            holder = yield Statement(self.q["unique_key_holder"], {"unique_key": unique_key})
            if holder.rows:
                return int(holder.rows[0][0]), False

    def enqueue_keyed_steps(self, batch: Any) -> Steps[list[int]]:
        """One SAVEPOINT around the call (a BEGIN/COMMIT of its own on a connection in autocommit mode
        with no transaction open): keyed items inserted one by one in key order (INSERT IGNORE, the
        holder read back: :meth:`enqueue_unique_steps`) -- so concurrent batches sharing keys wait on
        each other in the same order and never deadlock --, then the others in one multi-row INSERT.
        A refusal (DuplicateJob, or the server's) rolls back to the savepoint: the caller's
        transaction is left as it was. The ids are therefore not ascending in input order when keys
        are involved (they are on PostgreSQL)."""
        own = yield OWN_TRANSACTION
        if own:
            yield Statement("BEGIN")
        try:
            yield Statement(self.q["keyed_savepoint"])
            found: dict[int, int] = {}
            for i in sorted(batch.sent_keyed, key=lambda i: batch.keyed[i][0].encode()):
                key, on_conflict = batch.keyed[i]
                job_id, created = yield from self.enqueue_unique_steps(batch.jobs[i], key)
                if not created and on_conflict == "raise":
                    raise DuplicateJob(f"item {i}: job {job_id} already holds unique_key {key!r}; "
                                       "nothing was enqueued", job_id)
                found[i] = job_id
            plain = [i for i in batch.sent if i not in batch.keyed]
            ids = yield from self._insert_steps([batch.jobs[i] for i in plain])
            found.update(zip(plain, ids))
        except Exception:
            yield from undo(Statement(self.q["keyed_rollback"]), *([Statement("ROLLBACK")] if own else []))
            raise
        yield Statement(self.q["keyed_release"])
        if own:
            yield Statement("COMMIT")
        return [found[batch.same_as.get(i, i)] for i in range(len(batch.jobs))]

    def run(self, steps: Steps[T], conn: Any = None) -> T:
        """Run steps on ``conn`` (the caller's PyMySQL connection, or a lease: in its transaction),
        else in a pooled transaction committed at the end. Only skiplock errors leave (and the
        steps' own); a statement refused on a lease marks it ``in_error`` until its rollback."""
        if conn is None:
            with self._transaction() as c:
                return run(c, steps, self._fail)

        def fail(exc: BaseException) -> Exception:
            if isinstance(conn, MySQLLease) and not connection_lost(exc):
                conn.refused = True
            return self._fail(exc)
        return run(self._raw(conn), steps, fail)

    async def run_async(self, steps: Steps[T], conn: Any) -> T:
        """:meth:`run` on the caller's asyncio connection (asyncmy's -- the ``mysql`` extra's --, or
        aiomysql's), in its transaction: the same steps, awaited (AsyncApp.enqueue/enqueue_many)."""
        if not (callable(getattr(conn, "get_autocommit", None)) and callable(getattr(conn, "cursor", None))):
            raise ConfigurationError(f"conn must be an asyncio MySQL connection (asyncmy or aiomysql) on this "
                                     f"database, got {type(conn).__module__}.{type(conn).__qualname__}")
        return await run_async(conn, steps, self._fail)

    def _fail(self, exc: BaseException) -> Exception:
        return translate(exc, self.dsn)
