"""PostgreSQL implementation of the outbox store: the statements of outbox.sql on the backend's connections.

Short operations (put without a caller connection, claimed-lease claims and outcome writes, reads)
use the PostgresBackend's autocommit pool; a transaction-lease relay gets a dedicated connection
with the same session bounds as a worker slot (``connect_lease``), so a hung relay cannot hold its
rows forever.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from ..outbox_base import Finish, Message, MessageRecord, NewMessage
from .backend import PostgresBackend
from .queries import load_queries


class PostgresOutboxStore:
    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.q = load_queries(backend.schema, "outbox.sql")
        self._key_prefix = f"skiplock.outbox:{backend.schema}:"

    # ---- producing -----------------------------------------------------------------------------

    def put(self, messages: Sequence[NewMessage], conn: Any = None) -> list[tuple[int, str]]:
        """Insert messages; (id, idempotency key) per input, in input order. On ``conn`` the insert
        runs in the caller's transaction (an autocommit connection outside a transaction block gets
        one of its own, so the key locks and the insert stay together)."""
        if conn is None:
            with self.backend._conn() as c, c.transaction():
                return self._put(c, messages)
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            with conn.transaction():
                return self._put(conn, messages)
        return self._put(conn, messages)

    def _put(self, conn: Any, messages: Sequence[NewMessage]) -> list[tuple[int, str]]:
        cur = conn.cursor(row_factory=tuple_row)  # whatever row factory the caller's connection uses
        keys = sorted({m.key for m in messages if m.key is not None})
        if keys:
            cur.execute(self.q["lock_keys"], {"prefix": self._key_prefix, "keys": keys})
        cur.execute(self.q["put_many"], {
            "topics": [m.topic for m in messages], "keys": [m.key for m in messages],
            "payloads": [m.payload_json for m in messages],
            "idempotency_keys": [m.idempotency_key for m in messages],
            "max_attempts": [m.max_attempts for m in messages],
        })
        ids = {ikey: mid for mid, ikey in cur.fetchall()}
        missing = [m.idempotency_key for m in messages if m.idempotency_key not in ids]
        if missing:  # already stored under that idempotency key: return the stored message
            cur.execute(self.q["ids_by_idempotency_key"], {"idempotency_keys": missing})
            ids.update({ikey: mid for mid, ikey in cur.fetchall()})
        return [(ids[m.idempotency_key], m.idempotency_key) for m in messages]

    # ---- claimed lease -------------------------------------------------------------------------

    def claim_lease(self, owner: str, topics: Sequence[str] | None, limit: int,
                    lease_seconds: float) -> tuple[list[Message], int]:
        """Rescue expired leases, then claim up to ``limit`` messages for ``owner``; one short
        transaction. Returns (claimed messages in id order, number of leases rescued)."""
        with self.backend._conn() as c, c.transaction():
            rescued = len(c.execute(self.q["rescue_expired"]).fetchall())
            rows = c.execute(self.q["claim_lease"], {"owner": owner, "topics": list(topics) if topics else None,
                                                     "limit": limit, "lease": lease_seconds}).fetchall()
        return sorted((Message(*r) for r in rows), key=lambda m: m.id), rescued

    def extend_lease(self, owner: str, ids: Sequence[int], lease_seconds: float) -> int:
        with self.backend._conn() as c:
            return c.execute(self.q["extend_lease"], {"owner": owner, "ids": list(ids),
                                                      "lease": lease_seconds}).rowcount

    def finish_lease(self, owner: str, outcomes: Sequence[Finish]) -> list[int]:
        with self.backend._conn() as c:
            return self._finish(c, outcomes, expect="delivering", owner=owner, bump=0)

    # ---- transaction lease ---------------------------------------------------------------------

    def connect(self, application_name: str) -> psycopg.Connection[Any]:
        return self.backend.connect_lease(application_name)

    def claim_locked(self, conn: psycopg.Connection[Any], topics: Sequence[str] | None,
                     limit: int) -> list[Message]:
        rows = conn.execute(self.q["claim_locked"], {"topics": list(topics) if topics else None,
                                                     "limit": limit}).fetchall()
        return [Message(*r) for r in rows]

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
