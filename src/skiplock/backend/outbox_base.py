"""The outbox's backend interface: operations on messages (put, claim, finish, rescue, redrive), not SQL.

The relay and the writer only call these, so another database (MySQL 8 has SKIP LOCKED too) can
provide its own store without touching them. Rows cross the seam as the dataclasses below.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Protocol, Sequence

from .base import Notifications


@dataclass(frozen=True)
class NewMessage:
    """A validated message ready to insert: ``payload_json`` is already serialised and checked."""

    topic: str
    payload_json: str
    key: str | None
    idempotency_key: str
    max_attempts: int


@dataclass(frozen=True)
class Message:
    """A message as a sink sees it. ``attempt`` is the number of this delivery attempt (1 for the
    first). ``idempotency_key`` is the same on every attempt: receivers deduplicate on it."""

    id: int
    topic: str
    key: str | None
    payload: Any
    idempotency_key: str
    attempt: int
    max_attempts: int
    created_at: datetime


@dataclass(frozen=True)
class MessageRecord:
    """A stored message, for reading (``skiplock outbox``, :meth:`Outbox.get`)."""

    id: int
    topic: str
    key: str | None
    payload: Any
    idempotency_key: str
    state: str
    attempts: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    finished_at: datetime | None
    owner: str | None
    lease_expires_at: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class Finish:
    """The outcome to write for one message: state 'sent', 'pending' (retry after ``delay`` s) or 'failed'."""

    id: int
    state: str
    delay: float | None = None
    error: str | None = None


class OutboxLease(Protocol):
    """A transaction-lease relay's session: claim (row locks held by its open transaction), deliver
    into that transaction (``attempt``: under a savepoint; a transactional sink writes on ``conn``),
    finish, commit -- or roll back, and every message is available again. Only skiplock errors:
    a session that is gone raises ``ConnectionLost``, which ends the batch."""

    conn: Any  # what a transactional sink writes on (the driver's connection, user-facing)

    @property
    def closed(self) -> bool: ...
    def claim(self, topics: Sequence[str] | None, limit: int) -> list[Message]: ...
    def attempt(self, deliver: Callable[[Any], Any]) -> BaseException | None: ...
    def finish(self, outcomes: Sequence[Finish]) -> list[int]: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


class OutboxStore(Protocol):
    # producing (on the caller's connection when given: the message commits with the caller);
    # ``wake``: also notify listening relays when that transaction commits
    wake_payload: str
    def put(self, messages: Sequence[NewMessage], conn: Any = None, *, wake: bool = True,
            carrier: dict[str, str] | None = None) -> list[tuple[int, str]]: ...
    async def put_async(self, messages: Sequence[NewMessage], conn: Any, *,
                        wake: bool = True, carrier: dict[str, str] | None = None) -> list[tuple[int, str]]: ...

    # tracing on: the contexts messages were put under (``carrier`` of put), for the deliver span's links
    def trace_contexts(self, ids: Sequence[int]) -> dict[int, dict[str, str]]: ...

    # wake-ups: a listening session that receives the put notifications (payload ``wake_payload``)
    def connect_listener(self) -> Notifications: ...

    # claimed lease: short transactions; delivery happens between them
    def claim_lease(self, owner: str, topics: Sequence[str] | None, limit: int,
                    lease_seconds: float) -> tuple[list[Message], int]: ...
    def extend_lease(self, owner: str, ids: Sequence[int], lease_seconds: float) -> int: ...
    def finish_lease(self, owner: str, outcomes: Sequence[Finish]) -> list[int]: ...

    # transaction lease: a dedicated session whose transaction holds the row locks
    def open_lease(self, application_name: str) -> "OutboxLease": ...

    # reading and operating
    def get(self, message_id: int) -> MessageRecord | None: ...
    def list_messages(self, *, state: str | None, topic: str | None, limit: int) -> list[MessageRecord]: ...
    def counts(self) -> list[tuple[str, str, int]]: ...
    def states(self, ids: Sequence[int]) -> dict[int, str]: ...
    def redrive(self, ids: Sequence[int] | None, topic: str | None) -> list[int]: ...
    def prune_sent(self, age_seconds: float, batch: int) -> int: ...
