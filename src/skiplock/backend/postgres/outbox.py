"""PostgreSQL implementation of the outbox store: the statements of outbox.sql on the backend's connections.

Short operations (put without a caller connection, claimed-lease claims and outcome writes, reads)
use the PostgresBackend's autocommit pool; a transaction-lease relay gets a dedicated connection
with the same session bounds as a worker slot (``connect_lease_connection``), so a hung relay cannot hold its
rows forever.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Generator, Sequence

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from ..outbox_base import Finish, Message, MessageRecord, NewMessage
from .errors import translated
from .notifications import PostgresNotifications
from .outbox_lease import PostgresOutboxLease
from .queries import load_queries

if TYPE_CHECKING:  # the backend makes its store (PostgresBackend.outbox_store): no import cycle
    from .backend import PostgresBackend

# A sequence of statements: each step yields (query, params) and is sent back the rows it returned.
Steps = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], list[tuple[int, str]]]


def _run(cur: psycopg.Cursor[Any], steps: Steps) -> list[tuple[int, str]]:
    rows: Any = None
    try:
        while True:
            query, params = steps.send(rows)
            rows = cur.execute(query, params).fetchall()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _run_async(cur: psycopg.AsyncCursor[Any], steps: Steps) -> list[tuple[int, str]]:
    rows: Any = None
    try:
        while True:
            query, params = steps.send(rows)
            rows = await (await cur.execute(query, params)).fetchall()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class PostgresOutboxStore:
    def __init__(self, backend: "PostgresBackend"):
        self.backend = backend
        self.q = load_queries(backend.schema, "outbox.sql")
        self._key_prefix = f"skiplock.outbox:{backend.schema}:"
        # Relay wake-ups: NOTIFY on the fixed channel `skiplock` (never one named from user input),
        # shared with the job queue's `enqueued:<schema>`; listeners tell them apart by payload.
        self.wake_payload = f"outbox:{backend.schema}"

    # ---- producing -----------------------------------------------------------------------------

    def put(self, messages: Sequence[NewMessage], conn: Any = None, *, wake: bool = True,
            carrier: dict[str, str] | None = None) -> list[tuple[int, str]]:
        """Insert messages; (id, idempotency key) per input, in input order. On ``conn`` the insert
        runs in the caller's transaction (an autocommit connection outside a transaction block gets
        one of its own, so the key locks and the insert stay together). With ``wake``, the insert
        also queues one NOTIFY for relays, delivered when that transaction commits. ``carrier``
        (tracing on): the put span's trace context, stored with the inserted messages in the same
        transaction."""
        if conn is None:
            with self.backend._conn() as c, c.transaction():
                return _run(c.cursor(row_factory=tuple_row), self._put_steps(messages, wake, carrier))
        cur = conn.cursor(row_factory=tuple_row)  # whatever row factory the caller's connection uses
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            with conn.transaction():
                return _run(cur, self._put_steps(messages, wake, carrier))
        return _run(cur, self._put_steps(messages, wake, carrier))

    def trace_contexts(self, ids: Sequence[int]) -> dict[int, dict[str, str]]:
        """The trace contexts the messages ``ids`` were put under (those put while tracing was on)."""
        with translated(self.backend.dsn), self.backend._conn() as c:
            rows = c.execute(self.q["outbox_trace_contexts"], {"ids": list(ids)}).fetchall()
        return {message_id: json.loads(text) for message_id, text in rows}

    async def put_async(self, messages: Sequence[NewMessage], conn: psycopg.AsyncConnection[Any], *,
                        wake: bool = True, carrier: dict[str, str] | None = None) -> list[tuple[int, str]]:
        """:meth:`put` on the caller's ``AsyncConnection``: the very same statements, awaited."""
        cur = conn.cursor(row_factory=tuple_row)
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            async with conn.transaction():
                return await _run_async(cur, self._put_steps(messages, wake, carrier))
        return await _run_async(cur, self._put_steps(messages, wake, carrier))

    def _put_steps(self, messages: Sequence[NewMessage], wake: bool, carrier: dict[str, str] | None = None) -> Steps:
        """The statements of a put, as steps the sync and the async driver both run: one core, no
        twin implementations. Each ``yield`` sends a statement and receives its rows."""
        keys = sorted({m.key for m in messages if m.key is not None})
        if keys:
            yield self.q["lock_keys"], {"prefix": self._key_prefix, "keys": keys}
        rows = yield self.q["put_many"], {
            "topics": [m.topic for m in messages], "keys": [m.key for m in messages],
            "payloads": [m.payload_json for m in messages],
            "idempotency_keys": [m.idempotency_key for m in messages],
            "max_attempts": [m.max_attempts for m in messages],
            "wake": self.wake_payload if wake else None,
        }
        ids = {ikey: mid for mid, ikey in rows}
        if carrier and ids:  # tracing on: the inserted messages keep the put span's context
            yield self.q["store_outbox_traces"], {"ids": list(ids.values()), "carrier": json.dumps(carrier)}
        missing = [m.idempotency_key for m in messages if m.idempotency_key not in ids]
        if missing:  # already stored under that idempotency key: return the stored message
            rows = yield self.q["ids_by_idempotency_key"], {"idempotency_keys": missing}
            ids.update({ikey: mid for mid, ikey in rows})
        return [(ids[m.idempotency_key], m.idempotency_key) for m in messages]

    # ---- wake-ups ------------------------------------------------------------------------------

    def connect_listener(self) -> PostgresNotifications:
        """A session LISTENing on the fixed channel ``skiplock``, with the client TCP keepalives of the
        worker's listener (a dead connection raises ConnectionLost within about half a minute)."""
        return self.backend.connect_listener()

    # ---- claimed lease -------------------------------------------------------------------------

    def claim_lease(self, owner: str, topics: Sequence[str] | None, limit: int,
                    lease_seconds: float) -> tuple[list[Message], int]:
        """Rescue expired leases, then claim up to ``limit`` messages for ``owner``; one short
        transaction. Returns (claimed messages in id order, number of leases rescued)."""
        with translated(self.backend.dsn), self.backend._conn() as c, c.transaction():
            rescued = len(c.execute(self.q["rescue_expired"]).fetchall())
            messages = self._claim(c, topics, limit, owner, lease_seconds)
        return messages, rescued

    def extend_lease(self, owner: str, ids: Sequence[int], lease_seconds: float) -> int:
        with translated(self.backend.dsn), self.backend._conn() as c:
            return c.execute(self.q["extend_lease"], {"owner": owner, "ids": list(ids),
                                                      "lease": lease_seconds}).rowcount

    def finish_lease(self, owner: str, outcomes: Sequence[Finish]) -> list[int]:
        with translated(self.backend.dsn), self.backend._conn() as c:
            return self._finish(c, outcomes, expect="delivering", owner=owner, bump=0)

    # ---- transaction lease ---------------------------------------------------------------------

    def open_lease(self, application_name: str) -> PostgresOutboxLease:
        """A dedicated session for a transaction-lease relay (see outbox_lease.py)."""
        return PostgresOutboxLease(self, application_name)

    def connect(self, application_name: str) -> psycopg.Connection[Any]:
        return self.backend.connect_lease_connection(application_name)

    def claim_locked(self, conn: psycopg.Connection[Any], topics: Sequence[str] | None,
                     limit: int) -> list[Message]:
        return self._claim(conn, topics, limit, None, None)

    def _claim(self, conn: Any, topics: Sequence[str] | None, limit: int, owner: str | None,
               lease_seconds: float | None) -> list[Message]:
        """The one claim statement; ``owner`` None is the transaction lease. Messages in id order."""
        rows = conn.execute(self.q["claim"], {"topics": list(topics) if topics else None, "limit": limit,
                                              "owner": owner, "lease": lease_seconds}).fetchall()
        return sorted((Message(*r) for r in rows), key=lambda m: m.id)

    def finish_locked(self, conn: psycopg.Connection[Any], outcomes: Sequence[Finish]) -> list[int]:
        return self._finish(conn, outcomes, expect="pending", owner=None, bump=1)

    def savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["savepoint"])

    def rollback_to_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["rollback_to_savepoint"])

    def release_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["release_savepoint"])

    def _finish(self, conn: Any, outcomes: Sequence[Finish], *, expect: str, owner: str | None, bump: int) -> list[int]:
        if not outcomes:
            return []
        rows = conn.execute(self.q["finish"], {
            "ids": [o.id for o in outcomes], "states": [o.state for o in outcomes],
            "delays": [o.delay for o in outcomes], "errors": [o.error for o in outcomes],
            "expect": expect, "owner": owner, "bump": bump,
        }).fetchall()
        return [r[0] for r in rows]

    # ---- reading and operating -----------------------------------------------------------------

    def get(self, message_id: int) -> MessageRecord | None:
        with self.backend._conn() as c:
            row = c.cursor(row_factory=dict_row).execute(self.q["get_message"], {"id": message_id}).fetchone()
        return MessageRecord(**row) if row else None

    def list_messages(self, *, state: str | None, topic: str | None, limit: int) -> list[MessageRecord]:
        with self.backend._conn() as c:
            rows = c.cursor(row_factory=dict_row).execute(
                self.q["list_messages"], {"state": state, "topic": topic, "limit": limit}).fetchall()
        return [MessageRecord(**r) for r in rows]

    def counts(self) -> list[tuple[str, str, int]]:
        with self.backend._conn() as c:
            return [(r[0], r[1], r[2]) for r in c.execute(self.q["counts"]).fetchall()]

    def states(self, ids: Sequence[int]) -> dict[int, str]:
        with self.backend._conn() as c:
            return {r[0]: r[1] for r in c.execute(self.q["states_of"], {"ids": list(ids)}).fetchall()}

    def redrive(self, ids: Sequence[int] | None, topic: str | None) -> list[int]:
        with self.backend._conn() as c:
            rows = c.execute(self.q["redrive"], {"ids": list(ids) if ids is not None else None,
                                                 "topic": topic}).fetchall()
        return sorted(r[0] for r in rows)

    def prune_sent(self, age_seconds: float, batch: int) -> int:
        with self.backend._conn() as c:
            return c.execute(self.q["prune_sent"], {"age": age_seconds, "batch": batch}).rowcount
