"""The lease verbs for the asyncio worker (worker/aio_worker.py), on psycopg's ``AsyncConnection``.

Every statement is the sync path's, by name, from queries.sql (their invariants are stated there):
``claim_tasks*``, ``start_claimed``, ``heartbeat``, ``rescue_expired``, ``start_attempt``,
``savepoint``/``rollback_to_savepoint``/``release_savepoint``, ``set_local_timeouts``, ``complete`` and
``record_outcome``. Only the driver differs. Every connection comes from one
``psycopg_pool.AsyncConnectionPool`` of at most ``max_connections`` (the worker's whole budget), opened
with the lease sessions' bounds (connections.py: ``idle_in_transaction_session_timeout`` and, on
PostgreSQL 17+, ``transaction_timeout`` = ``lease_timeout``, TCP keepalives, ``tcp_user_timeout``,
``client_connection_check_interval``): a transaction-lease job's transaction is bounded by the server
exactly as the sync worker's is, and a vanished worker's sessions end, each rolling its job back.

Each method raises only skiplock errors (``errors.translate``), so the worker above never sees the
driver. A connection handed out by ``lease()`` is the handler's ``job.conn`` (transaction lease).
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ...errors import DatabaseUnavailable
from ..base import ClaimedJob
from .connecting import CLIENT_TCP, session_options, with_connect_timeout
from .errors import translate
from .lease import local_timeouts
from .queries import claim_of_queues, complete_statement, prepare_now, text_array, with_limit

if TYPE_CHECKING:
    from .connections import PostgresConnections


class AsyncLeasing:
    """The asyncio worker's connections (one pool) and lease verbs on PostgreSQL."""

    def __init__(self, backend: "PostgresConnections", max_connections: int):
        if max_connections < 2:
            raise ValueError(f"max_connections must be at least 2 (one claim, one finishing write), got {max_connections}")
        self.backend = backend
        self.q = backend.q
        self.dsn = backend.dsn
        self.max_connections = max_connections
        self._pool: AsyncConnectionPool | None = None

    # ---- connections ---------------------------------------------------------------------------

    async def open(self, application_name: str = "skiplock-aio") -> None:
        backend = self.backend
        ms = int(backend.lease_timeout * 1000)
        bounded = backend.capabilities.server_bounds_lease
        bounds = f"-c idle_in_transaction_session_timeout={ms} " if bounded else ""
        options = session_options(
            self.dsn, f"{bounds}-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 "
            "-c tcp_user_timeout=30000 -c client_connection_check_interval=5000")
        q = self.q

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            if bounded and conn.info.server_version >= 170000:
                await conn.execute(q["set_transaction_timeout"], {"value": f"{ms}ms"})
                await conn.commit()

        pool = AsyncConnectionPool(
            self.dsn, min_size=1, max_size=self.max_connections, open=False, name="skiplock-aio",
            kwargs={"autocommit": False, "application_name": application_name, "options": options,
                    **with_connect_timeout(self.dsn, backend.connect_timeout), **CLIENT_TCP},
            configure=configure, timeout=max(backend.connect_timeout, 30.0), reconnect_timeout=60)
        try:
            await pool.open(wait=True, timeout=backend.connect_timeout)
        except PoolTimeout:
            await pool.close()
            raise DatabaseUnavailable(f"the asyncio worker could not connect within {backend.connect_timeout:g}s") from None
        self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Any]:
        """A pooled connection whose next transaction is a lease (rolled back if left open)."""
        assert self._pool is not None, "open() first"
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    async def _fresh(self, name: str, params: dict[str, Any], many: bool = False) -> Any:
        """A named statement in its own short transaction on a pooled connection, committed."""
        async with self.lease() as conn:
            try:
                cur = await conn.cursor(row_factory=tuple_row).execute(self.q[name], params)
                rows = await cur.fetchall() if cur.description else []
                await conn.commit()
            except psycopg.Error as exc:
                raise translate(exc, self.dsn) from None
        return rows if many else (rows[0] if rows else None)

    async def _on(self, conn: Any, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        """Statement ``name`` on ``conn``."""
        return await self._on_text(conn, self.q[name], params)

    async def _on_text(self, conn: Any, query: str, params: dict[str, Any] | None = None,
                       limit: int | None = None) -> list[Any]:
        """A statement's text on ``conn``; ``limit``: a claim's, bound as ``queries.with_limit`` does
        (and the claim prepared from its first run: ``queries.prepare_now``)."""
        if limit is not None:
            query = with_limit(query, limit)
        try:
            cur = await conn.cursor(row_factory=tuple_row).execute(
                query, params, prepare=None if limit is None else prepare_now(conn))
            return await cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    # ---- the lease's state ---------------------------------------------------------------------

    @staticmethod
    def session_id(conn: Any) -> int:
        return int(conn.info.backend_pid)

    @staticmethod
    def alive(conn: Any) -> bool:
        return not (conn.closed or conn.broken)

    @staticmethod
    def in_transaction(conn: Any) -> bool:
        return not conn.closed and conn.info.transaction_status == TransactionStatus.INTRANS

    @staticmethod
    def usable(conn: Any) -> bool:
        """A transaction is open (possibly in error: a rollback to the savepoint fixes it)."""
        return not (conn.closed or conn.broken) and conn.info.transaction_status in (
            TransactionStatus.INTRANS, TransactionStatus.INERROR)

    async def commit(self, conn: Any) -> None:
        try:
            await conn.commit()
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    async def rollback(self, conn: Any) -> None:
        try:
            await conn.rollback()
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    # ---- claiming ------------------------------------------------------------------------------

    async def claim(self, conn: Any, queues: Sequence[str] | None, tasks: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Lock up to ``limit`` available jobs of the task names ``tasks`` in ``conn``'s transaction
        (``claim_tasks*`` in queries.sql)."""
        params: dict[str, Any]
        if queues:  # one queue's walk, a few queues' walks merged, or jobs_claim_any_idx
            query, params = claim_of_queues(self.q, "claim_tasks", queues)
        else:
            query, params = self.q["claim_tasks_any_queue"], {}
        params.update(limit=limit, tasks=text_array(tuple(tasks)))
        return [ClaimedJob(*row) for row in await self._on_text(conn, query, params, limit=limit)]

    async def claimable_queues(self, conn: Any, most: int) -> tuple[list[str], list[str]]:
        """``claimable_queues`` (queries.sql; worker/queue_view.py), in ``conn``'s transaction."""
        (paused, queued), = await self._on(conn, "claimable_queues", {"most": most})  # always one row
        return list(paused), list(queued)

    async def start_claimed_many(self, conn: Any, jobs: Sequence[tuple[ClaimedJob, uuid.UUID, float]],
                                 worker: str) -> list[tuple[int, str | None] | None]:
        """``start_claimed_many``: every job of the claim marked running in one statement, in the claim's
        transaction; the caller commits. Per job: (attempt, pending cancellation reason) or None if not queued."""
        rows = await self._on(conn, "start_claimed_many", {
            "ids": [j.id for j, _, _ in jobs], "owners": [o for _, o, _ in jobs], "leases": [x for _, _, x in jobs],
            "worker": worker})
        by_id = {r[0]: (int(r[1]), r[2]) for r in rows}
        return [by_id.get(j.id) for j, _, _ in jobs]

    async def heartbeat(self, leases: Sequence[tuple[int, uuid.UUID, float]]) -> set[int]:
        """Extend these claimed leases in one statement; the ids still owned."""
        rows = await self._fresh("heartbeat", {"ids": [x[0] for x in leases], "owners": [x[1] for x in leases],
                                               "leases": [x[2] for x in leases]}, many=True)
        return {r[0] for r in rows}

    async def cancel_requested(self, ids: Sequence[int]) -> set[int]:
        """Which of these jobs a cancellation was requested for (``cancel_requested``)."""
        return {r[0] for r in await self._fresh("cancel_requested", {"ids": list(ids)}, many=True)}

    async def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]:
        rows = await self._fresh("rescue_expired", {"batch": batch, "prefix": f"{self.backend.schema}:"}, many=True)
        return [(r[0], r[1]) for r in rows]

    async def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None,
                          host: str, pid: int, concurrency: int) -> None:
        """This worker's row in ``workers`` (``worker_seen``: what it can take, which process it is)."""
        await self._fresh("worker_seen", {"id": worker_id, "name": name, "tasks": list(tasks),
                                          "queues": None if queues is None else list(queues), "host": host,
                                          "pid": pid, "concurrency": concurrency})

    async def worker_gone(self, worker_id: uuid.UUID) -> None:
        await self._fresh("worker_gone", {"id": worker_id})

    # ---- the transaction lease -----------------------------------------------------------------

    async def start_attempt(self, job: ClaimedJob, worker: str, lease_pid: int) -> tuple[int, str | None, str | None, bool]:
        """Count the attempt durably outside the job's transaction (``start_attempt``; never exclusive:
        the process runs many jobs at once). Its own short transaction on a pooled connection."""
        row = await self._fresh("start_attempt", {"id": job.id, "attempts": job.attempts, "worker": worker,
                                                  "backend_pid": lease_pid, "exclusive": False, "batch": None})
        return int(row[0]), row[1], row[2], bool(row[3])

    async def mark_exclusive(self, job_id: int, attempt: int) -> None:
        """A suspect's attempt now runs alone in its process: charged if it never finishes (``mark_exclusive``)."""
        await self._fresh("mark_exclusive", {"id": job_id, "attempt": attempt})

    async def savepoint(self, conn: Any) -> None:
        await self._on(conn, "savepoint")

    async def rollback_to_savepoint(self, conn: Any) -> None:
        await self._on(conn, "rollback_to_savepoint")

    async def release_savepoint(self, conn: Any) -> None:
        await self._on(conn, "release_savepoint")

    async def set_local_timeouts(self, conn: Any, seconds: float) -> None:
        """A task's ``timeout`` for this transaction, counted from now (as ``Leasing.set_local_timeouts``)."""
        if not self.backend.capabilities.server_bounds_lease:
            return
        value, session = local_timeouts(seconds)
        await self._on(conn, "set_local_timeouts", {"value": value, "session": session})
        if conn.info.server_version >= 170000:
            await self._on(conn, "stop_local_transaction_timeout")
            await self._on(conn, "set_local_transaction_timeout", {"value": session})

    # ---- finishing writes ----------------------------------------------------------------------

    async def complete(self, conn: Any | None, job: ClaimedJob, attempt: int, result_json: str | None,
                       started_at: datetime, worker: str, owner: uuid.UUID | None = None) -> bool:
        """``complete`` on ``conn`` (the lease, not committed here) or, with None, fresh and committed."""
        params = {"id": job.id, "attempt": attempt, "result": result_json, "started_at": started_at,
                  "worker": worker, "owner": owner, "notice": self.backend.notice(job.id)}
        name = complete_statement(owner)
        row = (await self._on(conn, name, params))[0] if conn is not None else await self._fresh(name, params)
        return bool(row[0])

    async def complete_many(self, writes: Sequence[tuple[ClaimedJob, int, str | None, datetime, str, uuid.UUID]]) -> list[bool]:
        """Claimed-lease ``complete`` writes ((job, attempt, result JSON, started_at, worker, owner)),
        each fenced on its own row's state and owner, sent in one round trip (pipeline) in one short
        transaction on a pooled connection, committed: all of them or, if that transaction fails, none
        (the caller then writes them one by one). Per write: True if it was written ``done``."""
        async with self.lease() as conn:
            try:
                curs = []
                async with conn.pipeline():
                    for job, attempt, result, started_at, worker, owner in writes:
                        cur = conn.cursor(row_factory=tuple_row)
                        await cur.execute(self.q[complete_statement(owner)], {
                            "id": job.id, "attempt": attempt, "result": result, "started_at": started_at,
                            "worker": worker, "owner": owner, "notice": self.backend.notice(job.id)})
                        curs.append(cur)
                rows = [await cur.fetchone() for cur in curs]
                await conn.commit()
            except psycopg.Error as exc:
                if not (conn.closed or conn.broken):
                    await conn.rollback()
                raise translate(exc, self.dsn) from None
        return [bool(row[0]) if row else False for row in rows]

    async def record_outcome(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str,
                             delay: float | None, error: str | None, started_at: datetime, worker: str,
                             uncount: bool = False, owner: uuid.UUID | None = None) -> str | None:
        """``record_outcome`` on ``conn`` (the lease) or, with None, fresh and committed; the state written."""
        params = {"id": job.id, "attempt": attempt, "state": state, "delay": delay, "error": error, "owner": owner,
                  "started_at": started_at, "worker": worker, "uncount": uncount,
                  "notice": self.backend.notice(job.id)}
        if conn is not None:
            rows = await self._on(conn, "record_outcome", params)
            row = rows[0] if rows else None
        else:
            row = await self._fresh("record_outcome", params)
        return row[0] if row else None
