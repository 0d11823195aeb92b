"""MySQL/MariaDB implementation of the outbox store (outbox_base.OutboxStore): the statements of
outbox.sql on the backend's connections.

What it guarantees, as the PostgreSQL store does (docs/outbox.md, "On MySQL/MariaDB"):

- ``put`` on the caller's PyMySQL connection (``put_async`` on an asyncmy or aiomysql one: the same
  statement steps, steps.py) runs in the caller's transaction: the message exists only if that
  transaction commits (an autocommit connection outside a transaction gets one of its own, so the
  key locks and the insert stay together). Keyed writers serialise on their key's row in
  ``outbox_keys`` (outbox.sql: ``lock_keys``), so within a key id order is commit order;
- relays claim with ``SELECT … FOR UPDATE SKIP LOCKED`` on the claim index (never an id cursor),
  then update by primary key in the same transaction (no ``UPDATE … RETURNING``); a deadlock (1213)
  or a lock wait timeout (1205) rolls the whole attempt back and retries, as the jobs claim does;
- a key has at most one message in flight, delivered in id order (``claim`` + ``blocked_by_key``);
- outcomes are written fenced on the state (and owner token) the batch holds its rows in;
- wake-ups without LISTEN/NOTIFY: the relays' listener polls MAX(outbox.id) adaptively
  (notifications.py); a put writes nothing extra for it, so ``wake`` changes nothing here.

Short operations use the backend's pooled autocommit sessions (READ COMMITTED, short lock wait); a
transaction-lease relay gets a lease session of its own (outbox_lease.py). Only skiplock errors leave.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import pymysql

from ..outbox_base import Finish, Message, MessageRecord, NewMessage
from .errors import RETRYABLE, code, connection_lost
from .notifications import MySQLNotifications
from .outbox_lease import MySQLOutboxLease
from .sql import CLAIM_RETRIES, _load, _named, _utc
from .steps import OWN_TRANSACTION, Statement, Steps, undo

if TYPE_CHECKING:  # the backend makes its store (MySQLBackend.outbox_store): no import cycle
    from .backend import MySQLBackend

R = TypeVar("R")
PUT_CHUNK = 500  # messages per INSERT (and at most PUT_CHUNK_BYTES of payload): under max_allowed_packet
PUT_CHUNK_BYTES = 4 << 20
IN_CHUNK = 1000  # values per IN list


def key_hash(key: str) -> str:
    """The SHA-256 of an ordering key, in hex: its row in ``outbox_keys`` (``UNHEX`` in SQL)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _chunks(items: Sequence[R], size: int) -> list[Sequence[R]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _put_chunks(messages: Sequence[NewMessage]) -> list[Sequence[NewMessage]]:
    out: list[Sequence[NewMessage]] = []
    start, size = 0, 0
    for i, m in enumerate(messages):
        if i > start and (i - start >= PUT_CHUNK or size + len(m.payload_json) > PUT_CHUNK_BYTES):
            out.append(messages[start:i])
            start, size = i, 0
        size += len(m.payload_json)
    out.append(messages[start:])
    return out


def _message(row: Sequence[Any]) -> Message:
    """A claimed row (``claim``'s columns) as the sink sees it: ``attempt`` is this delivery's."""
    return Message(int(row[0]), row[1], row[2], json.loads(row[3]), row[4], int(row[5]) + 1, int(row[6]),
                   _utc(row[7]))


def _record(row: Sequence[Any]) -> MessageRecord:
    return MessageRecord(int(row[0]), row[1], row[2], json.loads(row[3]), row[4], row[5], int(row[6]), int(row[7]),
                         _utc(row[8]), _utc(row[9]), _utc(row[10]), row[11], _utc(row[12]), row[13])


class MySQLOutboxStore:
    def __init__(self, backend: "MySQLBackend"):
        self.backend = backend
        self.q = _named(_load("outbox.sql", backend.tables))
        self.wake_payload = f"outbox:{backend.schema}"

    # ---- producing -----------------------------------------------------------------------------

    def put(self, messages: Sequence[NewMessage], conn: Any = None, *, wake: bool = True) -> list[tuple[int, str]]:
        """Insert messages; (id, idempotency key) per input, in input order. On ``conn`` (the caller's
        PyMySQL connection) in its transaction, not committed here; an autocommit connection outside a
        transaction gets one of its own. ``wake`` is moot: relays see new rows by polling MAX(id)."""
        if conn is not None and not isinstance(conn, pymysql.connections.Connection):
            raise TypeError(f"on the MySQL backend, conn must be a PyMySQL connection, got {type(conn).__name__}")
        return self.backend.run(self._put_steps(messages), conn)

    async def put_async(self, messages: Sequence[NewMessage], conn: Any, *,
                        wake: bool = True) -> list[tuple[int, str]]:
        """:meth:`put` on the caller's asyncio connection (asyncmy or aiomysql): the very same
        statement steps, awaited, in its transaction."""
        return await self.backend.run_async(self._put_steps(messages), conn)

    def _put_steps(self, messages: Sequence[NewMessage]) -> Steps[list[tuple[int, str]]]:
        """The statements of a put (outbox.sql: lock_keys, put_many, ids_by_idempotency_key) as steps
        both drivers run (steps.py); a BEGIN/COMMIT of their own on an autocommit connection outside a
        transaction, so the key locks and the insert stay together."""
        own = yield OWN_TRANSACTION
        if own:
            yield Statement("BEGIN")
        try:
            hashes = sorted({key_hash(m.key) for m in messages if m.key is not None})
            for locked in _chunks(hashes, IN_CHUNK):
                yield Statement(self.q["lock_keys"].replace("{rows}", ", ".join([self.q["lock_key_row"]] * len(locked))),
                                list(locked))
            for chunk in _put_chunks(messages):
                params: list[Any] = []
                for m in chunk:
                    params += [m.topic, m.key, m.payload_json, m.idempotency_key, m.max_attempts]
                yield Statement(self.q["put_many"].replace("{rows}", ", ".join([self.q["put_row"]] * len(chunk))),
                                params)
            ids: dict[str, int] = {}
            for part in _chunks(list(dict.fromkeys(m.idempotency_key for m in messages)), IN_CHUNK):
                found = yield Statement(self.q["ids_by_idempotency_key"].replace("{keys}", ", ".join(["%s"] * len(part))),
                                        list(part))
                ids.update({ikey: int(mid) for mid, ikey in found.rows})
        except Exception:
            if own:
                yield from undo(Statement("ROLLBACK"))
            raise
        if own:
            yield Statement("COMMIT")
        return [(ids[m.idempotency_key], m.idempotency_key) for m in messages]

    # ---- wake-ups ------------------------------------------------------------------------------

    def connect_listener(self) -> MySQLNotifications:
        """An autocommit session polling MAX(outbox.id) (notifications.py: no LISTEN/NOTIFY on MySQL)."""
        conn = self.backend._connect(autocommit=True)
        try:
            return MySQLNotifications(conn, self.backend, queries=self.q, wake_payload=self.wake_payload)
        except BaseException:
            conn.close()
            raise

    # ---- claimed lease -------------------------------------------------------------------------

    def claim_lease(self, owner: str, topics: Sequence[str] | None, limit: int,
                    lease_seconds: float) -> tuple[list[Message], int]:
        """Rescue expired leases, then claim up to ``limit`` messages for ``owner``; one short
        transaction. Returns (claimed messages in id order, number of leases rescued)."""
        def claim(c: Any) -> tuple[list[Message], int]:
            with c.cursor() as cur:
                cur.execute(self.q["expired_leases"])
                expired = [int(r[0]) for r in cur.fetchall()]
                rescued = cur.execute(self.q["rescue"], {"ids": expired}) if expired else 0
                messages = self.claim_on(cur, topics, limit)
                if messages:
                    cur.execute(self.q["lease"], {"ids": [m.id for m in messages], "owner": owner,
                                                  "lease_us": int(lease_seconds * 1e6)})
            return messages, int(rescued)
        return self._retrying(claim)

    def extend_lease(self, owner: str, ids: Sequence[int], lease_seconds: float) -> int:
        if not ids:
            return 0
        with self.backend._conn() as c, c.cursor() as cur:
            return int(cur.execute(self.q["extend_lease"], {"owner": owner, "ids": list(ids),
                                                            "lease_us": int(lease_seconds * 1e6)}))

    def finish_lease(self, owner: str, outcomes: Sequence[Finish]) -> list[int]:
        if not outcomes:
            return []
        return self._retrying(lambda c: self.finish_on(c, outcomes, expect="delivering", owner=owner, bump=0))

    # ---- transaction lease ---------------------------------------------------------------------

    def open_lease(self, application_name: str) -> MySQLOutboxLease:
        """A dedicated lease session for a transaction-lease relay (see outbox_lease.py)."""
        return MySQLOutboxLease(self, application_name)

    def claim_on(self, cur: Any, topics: Sequence[str] | None, limit: int) -> list[Message]:
        """The one claim (outbox.sql: ``claim``, then ``blocked_by_key``) in the cursor's open
        transaction; the rows stay locked by it. Messages in id order."""
        cur.execute(self.q["claim"], {"all_topics": 0 if topics else 1, "topics": list(topics) if topics else [""],
                                      "limit": limit})
        messages = [_message(r) for r in cur.fetchall()]
        keyed = [m.id for m in messages if m.key is not None]
        if keyed:
            cur.execute(self.q["blocked_by_key"], {"ids": keyed})
            blocked = {int(r[0]) for r in cur.fetchall()}
            messages = [m for m in messages if m.id not in blocked]
        return sorted(messages, key=lambda m: m.id)

    def finish_on(self, conn: Any, outcomes: Sequence[Finish], *, expect: str, owner: str | None,
                  bump: int) -> list[int]:
        """The outcomes of the rows still held as ``expect`` (+ ``owner``), in the connection's open
        transaction (outbox.sql: ``finishable``, ``finish``); the ids written."""
        if not outcomes:
            return []
        with conn.cursor() as cur:
            held: set[int] = set()
            for part in _chunks([o.id for o in outcomes], IN_CHUNK):
                cur.execute(self.q["finishable"], {"ids": list(part), "expect": expect, "owner": owner})
                held.update(int(r[0]) for r in cur.fetchall())
            todo = [o for o in outcomes if o.id in held]
            for chunk in _chunks(todo, IN_CHUNK):
                params: list[Any] = []
                for o in chunk:
                    params += [o.id, o.state, None if o.delay is None else max(0, int(o.delay * 1e6)), o.error]
                params.append(bump)
                cur.execute(self.q["finish"].replace("{rows}", " UNION ALL ".join([self.q["finish_row"]] * len(chunk))),
                            params)
        return [o.id for o in todo]

    # ---- reading and operating -----------------------------------------------------------------

    def get(self, message_id: int) -> MessageRecord | None:
        with self.backend._conn() as c, c.cursor() as cur:
            cur.execute(self.q["get_message"], {"id": message_id})
            row = cur.fetchone()
        return _record(row) if row else None

    def list_messages(self, *, state: str | None, topic: str | None, limit: int) -> list[MessageRecord]:
        with self.backend._conn() as c, c.cursor() as cur:
            cur.execute(self.q["list_messages"], {"state": state, "topic": topic, "limit": limit})
            return [_record(r) for r in cur.fetchall()]

    def counts(self) -> list[tuple[str, str, int]]:
        with self.backend._conn() as c, c.cursor() as cur:
            cur.execute(self.q["counts"])
            return [(r[0], r[1], int(r[2])) for r in cur.fetchall()]

    def states(self, ids: Sequence[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        with self.backend._conn() as c, c.cursor() as cur:
            for part in _chunks(list(ids), IN_CHUNK):
                cur.execute(self.q["states_of"], {"ids": list(part)})
                found.update({int(r[0]): r[1] for r in cur.fetchall()})
        return found

    def redrive(self, ids: Sequence[int] | None, topic: str | None) -> list[int]:
        def redrive(c: Any) -> list[int]:
            with c.cursor() as cur:
                cur.execute(self.q["failed_to_redrive"], {"all_ids": 1 if ids is None else 0,
                                                          "ids": list(ids) if ids else [0], "topic": topic})
                found = sorted(int(r[0]) for r in cur.fetchall())
                for part in _chunks(found, IN_CHUNK):
                    cur.execute(self.q["redrive"], {"ids": list(part)})
            return found
        if ids is not None and not ids:
            return []
        return self._retrying(redrive)

    def prune_sent(self, age_seconds: float, batch: int) -> int:
        """Delete up to ``batch`` sent messages older than ``age_seconds``, and key rows unused as long
        (all of them once fewer than ``batch`` messages were left)."""
        age_us = int(age_seconds * 1e6)

        def prune(c: Any) -> int:
            with c.cursor() as cur:
                cur.execute(self.q["prune_sent"], {"age_us": age_us, "batch": batch})
                ids = [int(r[0]) for r in cur.fetchall()]
                return int(cur.execute(self.q["forget_sent"], {"ids": ids})) if ids else 0
        deleted = self._retrying(prune)
        while True:
            forgotten = self._retrying(lambda c: self._forget_keys(c, age_us, batch))
            if forgotten < batch or deleted == batch:  # more batches of messages follow: a call each
                return deleted

    def _forget_keys(self, conn: Any, age_us: int, batch: int) -> int:
        with conn.cursor() as cur:
            cur.execute(self.q["stale_keys"], {"age_us": age_us, "batch": batch})
            hashes = [r[0] for r in cur.fetchall()]
            if hashes:
                cur.execute(self.q["forget_keys"], {"hashes": hashes})
        return len(hashes)

    # ---- transactions --------------------------------------------------------------------------

    def _retrying(self, fn: Callable[[Any], R]) -> R:
        """``fn(conn)`` in a transaction on a pooled session, committed; a deadlock (1213) or lock wait
        timeout (1205) rolls the attempt back and runs it again (CLAIM_RETRIES times, with jitter)."""
        for attempt in range(CLAIM_RETRIES):
            with self.backend._conn() as conn:  # translates what leaves it
                conn.begin()
                try:
                    result = fn(conn)
                    conn.commit()
                    return result
                except pymysql.err.MySQLError as exc:
                    self._quiet_rollback(conn)
                    if code(exc) not in RETRYABLE or connection_lost(exc) or attempt == CLAIM_RETRIES - 1:
                        raise
                except BaseException:
                    self._quiet_rollback(conn)
                    raise
            time.sleep(random.uniform(0, 0.01 * 2 ** attempt))
        raise AssertionError("unreachable")

    @staticmethod
    def _quiet_rollback(conn: Any) -> None:
        try:
            conn.rollback()
        except pymysql.err.Error:
            pass  # a lost session: the server rolled it back
