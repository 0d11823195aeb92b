"""The transaction lease of a relay (PostgreSQL): one dedicated session whose open transaction holds
the claimed messages' row locks while they are delivered, then writes their outcomes and commits.

A crash or a lost session rolls everything back (the messages are available again at once). Each
delivery into this transaction (a transactional sink writing on ``conn``) runs under a savepoint, so
one failing message is undone alone. Only skiplock errors leave: a session that is gone raises
:class:`~skiplock.errors.ConnectionLost`, another driver error :class:`~skiplock.errors.DatabaseError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import psycopg

from ...errors import DatabaseUnavailable
from ..outbox_base import Finish, Message
from .errors import translate, translated

if TYPE_CHECKING:
    from .outbox import PostgresOutboxStore


class PostgresOutboxLease:
    def __init__(self, store: "PostgresOutboxStore", application_name: str):
        self._store = store
        self._dsn = store.backend.dsn
        with translated(self._dsn):
            # The session bounds of a worker slot's lease: a hung relay cannot hold its rows forever.
            self.conn: psycopg.Connection[Any] = store.backend.connect_lease_connection(application_name)

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed or self.conn.broken)

    def claim(self, topics: Sequence[str] | None, limit: int) -> list[Message]:
        with translated(self._dsn):
            self._store.backend.begin_lease_transaction(self.conn)  # behind a pooler: the bounds, per transaction
            return self._store.claim_locked(self.conn, topics, limit)

    def attempt(self, deliver: Callable[[Any], Any]) -> BaseException | None:
        """``deliver(conn)`` under a savepoint: None when it returned (its writes kept), else its
        exception (its writes undone). A driver ``OperationalError`` or a lost database is raised
        instead (translated): the session, and so the batch, cannot go on."""
        with translated(self._dsn):
            self._store.savepoint(self.conn)
        try:
            deliver(self.conn)
        except psycopg.OperationalError as exc:
            raise translate(exc, self._dsn) from None
        except DatabaseUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the message's outcome
            with translated(self._dsn):
                self._store.rollback_to_savepoint(self.conn)
            return exc
        with translated(self._dsn):
            self._store.release_savepoint(self.conn)
        return None

    def finish(self, outcomes: Sequence[Finish]) -> list[int]:
        with translated(self._dsn):
            return self._store.finish_locked(self.conn, outcomes)

    def commit(self) -> None:
        with translated(self._dsn):
            self.conn.commit()

    def rollback(self) -> None:
        with translated(self._dsn):
            self.conn.rollback()

    def close(self) -> None:
        self.conn.close()
