"""The transaction lease of a relay (MySQL/MariaDB): one lease session (``connect_lease``: READ
COMMITTED, autocommit off, MariaDB's ``idle_transaction_timeout`` = the backend's ``lease_timeout``)
whose open transaction holds the claimed messages' row locks while they are delivered, then writes
their outcomes and commits.

A crash, a lost session or a KILL rolls everything back (the messages are available again at once).
Each delivery into this transaction (a transactional sink writing on ``conn``, the PyMySQL
connection) runs under a savepoint, so one failing message is undone alone. Only skiplock errors
leave: a session that is gone raises :class:`~skiplock.errors.ConnectionLost`, another driver error
:class:`~skiplock.errors.DatabaseError` -- a deadlock (1213) inside a delivery, after which InnoDB has
rolled the whole transaction back, is raised too: the batch cannot go on.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pymysql

from ...errors import DatabaseUnavailable
from ..outbox_base import Finish, Message
from .errors import RETRYABLE, code, translate, translated
from .sql import CLAIM_RETRIES

if TYPE_CHECKING:
    from .lease import MySQLLease
    from .outbox import MySQLOutboxStore


class MySQLOutboxLease:
    def __init__(self, store: "MySQLOutboxStore", application_name: str):
        self._store = store
        self._dsn = store.backend.dsn
        self._lease: "MySQLLease" = store.backend.connect_lease(application_name)
        self.conn: Any = self._lease.conn  # the PyMySQL connection a transactional sink writes on

    @property
    def closed(self) -> bool:
        return not self._lease.alive()

    def claim(self, topics: Sequence[str] | None, limit: int) -> list[Message]:
        """BEGIN, then the claim (outbox.sql); a deadlock or lock wait timeout rolls back and retries."""
        for attempt in range(CLAIM_RETRIES):
            try:
                self.conn.begin()
                with self.conn.cursor() as cur:
                    return self._store.claim_on(cur, topics, limit)
            except pymysql.err.MySQLError as exc:
                if code(exc) not in RETRYABLE or attempt == CLAIM_RETRIES - 1:
                    raise translate(exc, self._dsn) from None
                with translated(self._dsn):
                    self.conn.rollback()
            time.sleep(random.uniform(0, 0.01 * 2 ** attempt))
        return []

    def _execute(self, name: str) -> None:
        with translated(self._dsn), self.conn.cursor() as cur:
            cur.execute(self._store.q[name])

    def attempt(self, deliver: Callable[[Any], Any]) -> BaseException | None:
        """``deliver(conn)`` under a savepoint: None when it returned (its writes kept), else its
        exception (its writes undone). A driver ``OperationalError`` (a lost session, a deadlock) or a
        lost database is raised instead (translated): the session, and so the batch, cannot go on."""
        self._execute("savepoint")
        try:
            deliver(self.conn)
        except pymysql.err.OperationalError as exc:
            raise translate(exc, self._dsn) from None
        except DatabaseUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the message's outcome
            self._execute("rollback_to_savepoint")
            return exc
        self._execute("release_savepoint")
        return None

    def finish(self, outcomes: Sequence[Finish]) -> list[int]:
        with translated(self._dsn):
            return self._store.finish_on(self.conn, outcomes, expect="pending", owner=None, bump=1)

    def commit(self) -> None:
        self._lease.commit()

    def rollback(self) -> None:
        self._lease.rollback()

    def close(self) -> None:
        self._lease.close()
