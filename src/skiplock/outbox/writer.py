"""The outbox writer: ``put`` a message in the caller's transaction, so it exists only if that commits.

Also the operator's reads and actions on stored messages (get, list, counts, redrive, prune).
"""

from __future__ import annotations

import asyncio
import functools
import math
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple, Sequence

from ..values import check_text, to_json
from ..backend.drivers import is_async_connection
from ..backend.outbox_base import MessageRecord, NewMessage, OutboxStore
from .errors import InvalidMessage, MessageNotFound

if TYPE_CHECKING:
    from ..app import App

DEFAULT_MAX_ATTEMPTS = 10
MAX_TOPIC_CHARS = 200
MAX_KEY_CHARS = 1000
MAX_IDEMPOTENCY_KEY_CHARS = 200
STATES = ("pending", "delivering", "sent", "failed")
INT32_MAX = 2**31 - 1


class MessageRef(NamedTuple):
    """What :meth:`Outbox.put` stored: the message id and its idempotency key."""

    id: int
    idempotency_key: str


def _check_text(name: str, value: Any, limit: int, *, optional: bool = False) -> str | None:
    """The queue's one text check (:func:`skiplock.app.check_text`), raising InvalidMessage."""
    return check_text(name, value, limit, optional=optional, error=InvalidMessage)


def serialise_payload(payload: Any, limit: int) -> str:
    """JSON text for jsonb (any JSON value: object, array, string, number, true/false/null), or
    InvalidMessage saying exactly why not."""
    return to_json(payload, "payload", limit, InvalidMessage)


class Outbox:
    """Writes messages into the outbox and reads them back. Get it as ``app.outbox``.

    ``put(topic, payload, key=None, conn=caller_conn)`` inserts in the caller's transaction: the
    message is published if and only if that transaction commits. Without ``conn`` it is stored at
    once on a pooled connection. A relay (``app.relay(sink)`` / ``skiplock relay``) delivers it.
    ``await put_async(..., conn=async_conn)`` does the same on a ``psycopg.AsyncConnection``.

    On PostgreSQL every put also sends one NOTIFY (channel ``skiplock``, payload ``outbox:<schema>``),
    delivered when the transaction commits, so idle relays wake at once instead of at their next poll
    (on MySQL/MariaDB relays poll the outbox's MAX(id) instead; a put sends nothing). Set
    ``notify = False`` to send none (relays then find messages by polling): a committing
    transaction that has notified takes a cluster-wide lock for its commit, so producers that
    commit many small transactions at once serialise there.
    """

    def __init__(self, app: "App", *, default_max_attempts: int = DEFAULT_MAX_ATTEMPTS, notify: bool = True):
        self.app = app
        self.default_max_attempts = default_max_attempts
        self.notify = notify
        self._store: OutboxStore | None = None
        self._backend: Any = None

    @property
    def store(self) -> OutboxStore:
        """The backend's outbox operations (checks the schema on first use; follows the app to a new
        backend after ``app.close()``)."""
        backend = self.app._ready()
        if self._store is None or self._backend is not backend:
            self._store, self._backend = backend.outbox_store(), backend
        return self._store

    # ---- writing -------------------------------------------------------------------------------

    def _new(self, topic: Any, payload: Any, key: Any, idempotency_key: Any, max_attempts: Any) -> NewMessage:
        topic = _check_text("topic", topic, MAX_TOPIC_CHARS)
        key = _check_text("key", key, MAX_KEY_CHARS, optional=True)
        idempotency_key = _check_text("idempotency_key", idempotency_key, MAX_IDEMPOTENCY_KEY_CHARS, optional=True)
        if idempotency_key is not None and not all(33 <= ord(c) <= 126 for c in idempotency_key):
            raise InvalidMessage("idempotency_key must be visible ASCII without spaces (it travels in an HTTP header), "
                                 f"got {idempotency_key!r}")
        if max_attempts is None:
            max_attempts = self.default_max_attempts
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= INT32_MAX:
            raise InvalidMessage(f"max_attempts must be an integer between 1 and {INT32_MAX}, got {max_attempts!r}")
        return NewMessage(topic=topic, payload_json=serialise_payload(payload, self.app.max_args_bytes),  # type: ignore[arg-type]
                          key=key, idempotency_key=idempotency_key or str(uuid.uuid4()), max_attempts=max_attempts)

    def put(self, topic: str, payload: Any, key: str | None = None, *, conn: Any = None,
            idempotency_key: str | None = None, max_attempts: int | None = None) -> MessageRef:
        """Store one message; returns its id and idempotency key.

        - ``conn``: the caller's driver connection (psycopg; PyMySQL on the MySQL backend); the
          message is written in its current transaction and exists only if the caller commits. A
          rolled-back transaction publishes nothing.
        - ``key``: ordering key. Messages with the same key are delivered one at a time in commit
          order. Costs: writers of one key serialise (a transaction-scoped lock on the key is held
          until the writer commits), and one slow or failing message holds up its key's later ones.
        - ``idempotency_key``: sent with every delivery attempt so receivers can deduplicate;
          generated (a UUID) when not given. Putting a key that is already stored stores nothing
          and returns the stored message (a producer's own retries publish once).
        - ``max_attempts``: delivery attempts before the message ends ``failed`` [10].

        Invalid input raises :class:`InvalidMessage` before any SQL runs.
        """
        message = self._new(topic, payload, key, idempotency_key, max_attempts)
        return self._put([message], conn)[0]

    def put_many(self, messages: Iterable[Mapping[str, Any] | Sequence[Any]], *, conn: Any = None) -> list[MessageRef]:
        """Store many messages in one statement; refs in input order. Each item is ``(topic, payload)``,
        ``(topic, payload, key)`` or a mapping with ``topic``, ``payload`` and optionally ``key``,
        ``idempotency_key``, ``max_attempts``."""
        return self._put(self._new_many(messages), conn)

    async def put_async(self, topic: str, payload: Any, key: str | None = None, *, conn: Any = None,
                        idempotency_key: str | None = None, max_attempts: int | None = None) -> MessageRef:
        """:meth:`put` for asyncio. On a ``psycopg.AsyncConnection`` the same statements run on that
        connection, in its current transaction: the message exists only if the caller commits.
        Without ``conn`` (or with a sync connection) :meth:`put` runs in a thread."""
        message = self._new(topic, payload, key, idempotency_key, max_attempts)
        return (await self._put_async([message], conn))[0]

    async def put_many_async(self, messages: Iterable[Mapping[str, Any] | Sequence[Any]], *,
                             conn: Any = None) -> list[MessageRef]:
        """:meth:`put_many` for asyncio, on a ``psycopg.AsyncConnection`` as :meth:`put_async`."""
        return await self._put_async(self._new_many(messages), conn)

    def _put(self, new: list[NewMessage], conn: Any) -> list[MessageRef]:
        if not new:
            return []
        if is_async_connection(conn):
            raise TypeError("an AsyncConnection needs `await outbox.put_async(...)` / `put_many_async`")
        tracing = self.app.tracing
        if tracing is None:
            return [MessageRef(mid, ikey) for mid, ikey in self.store.put(new, conn, wake=self.notify)]
        with tracing.outbox_put(new[0].topic, len(new)) as carrier:  # observability/tracing.py
            return [MessageRef(mid, ikey) for mid, ikey in self.store.put(new, conn, wake=self.notify,
                                                                          carrier=carrier)]

    async def _put_async(self, new: list[NewMessage], conn: Any) -> list[MessageRef]:
        if not is_async_connection(conn):
            return await asyncio.to_thread(functools.partial(self._put, new, conn))
        if not new:
            return []
        store = await asyncio.to_thread(lambda: self.store)  # the first use checks the schema
        tracing = self.app.tracing
        if tracing is None:
            return [MessageRef(mid, ikey) for mid, ikey in await store.put_async(new, conn, wake=self.notify)]
        with tracing.outbox_put(new[0].topic, len(new)) as carrier:  # current in this coroutine's context
            return [MessageRef(mid, ikey) for mid, ikey in await store.put_async(new, conn, wake=self.notify,
                                                                                 carrier=carrier)]

    def _new_many(self, messages: Iterable[Mapping[str, Any] | Sequence[Any]]) -> list[NewMessage]:
        new: list[NewMessage] = []
        for i, item in enumerate(messages):
            try:
                if isinstance(item, Mapping):
                    unknown = set(item) - {"topic", "payload", "key", "idempotency_key", "max_attempts"}
                    if unknown or "topic" not in item or "payload" not in item:
                        raise InvalidMessage(f"needs 'topic' and 'payload' (optional: key, idempotency_key, "
                                             f"max_attempts), got keys {sorted(item)}")
                    new.append(self._new(item["topic"], item["payload"], item.get("key"), item.get("idempotency_key"),
                                         item.get("max_attempts")))
                elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
                    new.append(self._new(item[0], item[1], item[2] if len(item) == 3 else None, None, None))
                else:
                    raise InvalidMessage(f"expected (topic, payload), (topic, payload, key) or a mapping, got {item!r}")
            except InvalidMessage as exc:
                raise InvalidMessage(f"message {i}: {exc}") from None
        return new

    # ---- reading -------------------------------------------------------------------------------

    def get(self, message_id: int) -> MessageRecord:
        record = self.store.get(message_id)
        if record is None:
            raise MessageNotFound(f"no outbox message with id {message_id}")
        return record

    def list_messages(self, *, state: str | None = None, topic: str | None = None, limit: int = 50) -> list[MessageRecord]:
        """Messages, newest first; ``state`` is one of pending, delivering, sent, failed."""
        if state is not None and state not in STATES:
            raise InvalidMessage(f"unknown state {state!r}; one of {', '.join(STATES)}")
        return self.store.list_messages(state=state, topic=topic, limit=limit)

    def failed(self, *, topic: str | None = None, limit: int = 50) -> list[MessageRecord]:
        """The dead letters: messages that used up their attempts or were rejected permanently."""
        return self.list_messages(state="failed", topic=topic, limit=limit)

    def counts(self) -> list[tuple[str, str, int]]:
        """(topic, state, count) for every topic and state that has messages."""
        return self.store.counts()

    # ---- operating -----------------------------------------------------------------------------

    def redrive(self, ids: Iterable[int] | None = None, *, topic: str | None = None) -> list[int]:
        """Send failed messages again (fresh attempts, due now); returns the ids redriven.

        With ``ids``: exactly those, each of which must exist and be ``failed`` (else nothing is
        changed and :class:`MessageNotFound` / :class:`InvalidMessage` says which). Without: every
        failed message (of ``topic``, if given)."""
        if ids is None:
            return self.store.redrive(None, topic)
        wanted = list(dict.fromkeys(ids))
        for i in wanted:
            if isinstance(i, bool) or not isinstance(i, int):
                raise InvalidMessage(f"message ids are integers, got {i!r}")
        if not wanted:
            return []
        states = self.store.states(wanted)
        unknown = [i for i in wanted if i not in states]
        if unknown:
            raise MessageNotFound(f"no outbox message with id {', '.join(map(str, unknown))}")
        not_failed = [f"{i} is {states[i]}" for i in wanted if states[i] != "failed"]
        if not_failed:
            raise InvalidMessage(f"only failed messages can be redriven: {'; '.join(not_failed)}")
        return self.store.redrive(wanted, topic)

    def prune(self, older_than: float | timedelta, *, batch: int = 10_000) -> int:
        """Delete sent messages finished more than ``older_than`` (seconds) ago; returns how many.
        Failed messages are kept until redriven. A pruned message's idempotency key can be reused."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidMessage(f"older_than must be a non-negative number of seconds, got {older_than!r}")
        total = 0
        while True:
            n = self.store.prune_sent(float(seconds), batch)
            total += n
            if n < batch:
                return total
