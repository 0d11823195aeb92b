"""Producing jobs on PostgreSQL: one INSERT statement (or COPY for large batches), unique keys,
and the statement steps shared by the sync and asyncio paths (steps.py)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import psycopg
from psycopg.rows import tuple_row

from ...errors import DatabaseUnavailable, DuplicateJob
from ..base import NewJob
from ..keyed import same_keys
from .connections import PostgresConnections
from .errors import translated
from .steps import Steps, T, Undoable, run, run_async

# A batch of at least this many jobs is inserted with COPY instead of one INSERT … unnest statement:
# below it the extra round trip costs more than COPY saves (bench: see PostgresBackend._copy_jobs).
COPY_MIN_JOBS = 1000
# Client-side formats of the COPY columns (text format; args is JSON text the server parses as jsonb).
COPY_TYPES = ("int8", "text", "text", "text", "int4", "int4", "bool", "timestamptz")


def distinct_queues(jobs: Sequence[NewJob]) -> list[str]:
    """A batch's queue names, each once: the `limit_queues` parameter of the statements that set the
    ``flow`` flag (``flow_hint_of_many`` in queries.sql)."""
    return sorted({j.queue for j in jobs})


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
        self.same_as = same_keys(keyed)  # a later item -> the first item with its key
        self.sent = [i for i in range(len(jobs)) if i not in self.same_as]
        self.strict = [i for i in sorted(keyed) if keyed[i][1] == "raise"]  # none of them in same_as
        self._found: dict[int, tuple[bool, int | None]] = {}

    def insert(self, backend: "Producing") -> tuple[str, dict[str, Any]]:
        jobs = [self.jobs[i] for i in self.sent]
        return backend.q["enqueue_many_unique"], {
            "wake": backend.wake_payload, "schema": backend.schema,
            "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs], "args": [j.args_json for j in jobs],
            "limit_queues": distinct_queues(jobs),
            "priorities": [j.priority for j in jobs], "max_attempts": [j.max_attempts for j in jobs],
            "run_ats": [j.run_at for j in jobs],
            "unique_keys": [self.keyed[i][0] if i in self.keyed else None for i in self.sent],
            "partitions": [j.partition for j in jobs],
        }

    def inserted(self, backend: "Producing", rows: Sequence[Sequence[Any]]) -> tuple[str, dict[str, Any]] | None:
        """Take :meth:`insert`'s rows ((created, id) per item sent, in order); returns the lookup to
        run next, in a new statement, or None if every item has its id."""
        if len(rows) != len(self.sent):
            raise RuntimeError(f"enqueue_many_unique returned {len(rows)} rows for {len(self.sent)} items")
        self._found = {i: (bool(created), job_id) for i, (created, job_id) in zip(self.sent, rows)}
        missing = [self.keyed[i][0] for i, (_, job_id) in self._found.items() if job_id is None]
        return (backend.q["unique_key_holders"], {"unique_keys": missing}) if missing else None

    def attempt(self, backend: "Producing") -> Steps[list[int]]:
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


class Producing(PostgresConnections):
    # ---- producing ---------------------------------------------------------------------------

    def enqueue_statement(self, jobs: Sequence[NewJob]) -> tuple[str, dict[str, Any]]:
        """The one statement inserting ``jobs`` (ids come back in order), for any connection kind."""
        if len(jobs) == 1:
            j = jobs[0]
            return self.q["enqueue_one"], {
                "wake": self.wake_payload, "queue": j.queue, "task": j.task, "args": j.args_json,
                "priority": j.priority, "max_attempts": j.max_attempts, "run_at": j.run_at,
                "partition": j.partition, "sequence": j.sequence, "on_failure": j.sequence_on_failure,
            }
        return self.q["enqueue_many"], {
            "wake": self.wake_payload, "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs],
            "limit_queues": distinct_queues(jobs),
            "args": [j.args_json for j in jobs], "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs], "run_ats": [j.run_at for j in jobs],
            "partitions": [j.partition for j in jobs], "sequences": [j.sequence for j in jobs],
            "on_failures": [j.sequence_on_failure for j in jobs],
        }

    def enqueue_unique_statement(self, job: NewJob, unique_key: str) -> tuple[str, dict[str, Any]]:
        return self.q["enqueue_unique"], {
            "wake": self.wake_payload, "queue": job.queue, "task": job.task, "args": job.args_json, "priority": job.priority,
            "max_attempts": job.max_attempts, "run_at": job.run_at, "unique_key": unique_key,
            "partition": job.partition,
        }

    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]:
        """Insert jobs in one transaction, ids in input order; on ``conn`` they exist only if the
        caller commits. Fewer than COPY_MIN_JOBS: one INSERT statement; more: :meth:`_copy_jobs`
        (measured on a local socket, COPY is ahead from ~50 jobs, and 1.9x at 1,000; the threshold
        leaves room for the extra round trips of a network: BEGIN, the id reservation, COPY, COMMIT)."""
        _not_async(conn)
        # COPY has no partition or sequence column
        if len(jobs) >= COPY_MIN_JOBS and not any(j.partition is not None or j.sequence is not None for j in jobs):
            if conn is None:
                with self._conn() as c, c.transaction():
                    return self._copy_jobs(c, jobs)
            # The caller's connection, unless COPY cannot run there (pipeline mode) or could fail
            # half-way (a client encoding other than UTF-8 may not represent some text: the INSERT
            # path fails on it before sending anything, leaving the caller's transaction usable).
            if not conn.pgconn.pipeline_status and conn.info.encoding == "utf-8":
                with translated(self.dsn):
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
        pooled autocommit connection. Driver errors come out as skiplock errors (on the caller's
        connection too: a refused statement is a ``DatabaseError`` with the server's ``sqlstate``, and
        the caller's transaction is then aborted as after any failed statement)."""
        _not_async(conn)
        if conn is not None:
            with translated(self.dsn):
                return run(conn, steps)
        with self._conn() as c:
            return run(c, steps)

    async def run_async(self, steps: Steps[T], conn: "psycopg.AsyncConnection[Any]") -> T:
        """Run steps on the caller's ``AsyncConnection``, in its current transaction; driver errors
        come out as skiplock errors, as from :meth:`run`."""
        with translated(self.dsn):
            return await run_async(conn, steps)

    def _copy_jobs(self, conn: psycopg.Connection[Any], jobs: Sequence[NewJob]) -> list[int]:
        """Inside a transaction: one statement reserves the ids (in input order), reads the
        transaction's ``now()``, queues the wake-up NOTIFY and finds which of the batch's queues have
        limits (their rows locked to the COMMIT: the ``flow`` flag, ``flow_hint_of_many`` in
        queries.sql); then COPY streams the rows, each with
        its id, in text format (psycopg formats rows in C; the server parses args as jsonb). Rows are
        sent as they are formatted, so the client's work overlaps the server's. A job without run_at
        gets that ``now()``, as ``coalesce(run_at, now())`` gives it in the INSERT path (a batch
        with none leaves the column to its default, the same ``now()``)."""
        cur = conn.cursor(row_factory=tuple_row)  # the caller's cursor class (ClientCursor: text results only)
        ids, now, _, limited = cur.execute(self.q["reserve_job_ids"], {
            "schema": self.schema, "n": len(jobs), "wake": self.wake_payload,
            "limit_queues": distinct_queues(jobs)}).fetchall()[0]
        flagged = set(limited)  # the batch's queues with limits (the `flow` flag: migration 17)
        ids.sort()  # already ascending (one nextval per row, in order); sorting makes it a guarantee
        with_run_at = any(j.run_at is not None for j in jobs)
        with cur.copy(self.q["copy_jobs_run_at" if with_run_at else "copy_jobs"]) as copy:
            copy.set_types(COPY_TYPES if with_run_at else COPY_TYPES[:-1])
            write = copy.write_row
            if with_run_at:
                for job_id, j in zip(ids, jobs):
                    write((job_id, j.queue, j.task, j.args_json, j.priority, j.max_attempts, j.queue in flagged,
                           now if j.run_at is None else j.run_at))
            else:
                for job_id, j in zip(ids, jobs):
                    write((job_id, j.queue, j.task, j.args_json, j.priority, j.max_attempts, j.queue in flagged))
        return ids

    def keyed_batch(self, jobs: Sequence[NewJob], keyed: Mapping[int, tuple[str, str]]) -> KeyedBatch:
        """An ``enqueue_many`` batch with unique keys (:class:`KeyedBatch`; refuses in-call duplicates)."""
        return KeyedBatch(jobs, keyed)

    def enqueue_keyed(self, batch: KeyedBatch, conn: Any = None) -> list[int]:
        """``enqueue_many`` with unique keys (see :class:`KeyedBatch`): ids in input order, an item
        whose key is held getting the holder's id. Always one INSERT statement (never COPY). Each
        attempt is undoable, so a refusal (DuplicateJob) or a retry leaves nothing behind: see
        :func:`steps.undoable`."""
        return self.run(self.enqueue_keyed_steps(batch), conn)

    def enqueue_unique(self, job: NewJob, unique_key: str, conn: Any = None) -> tuple[int, bool]:
        """(id, created): the new job, or the queued/running one holding ``unique_key``
        (:meth:`enqueue_unique_steps`)."""
        return self.run(self.enqueue_unique_steps(job, unique_key), conn)
