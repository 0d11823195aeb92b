"""PostgreSQL implementation of the backend port (psycopg 3 + psycopg_pool), assembled from its parts:

- connections.py -- the pool, lease and bookkeeping sessions, the listener (the session bounds that
  keep a paused, hung or partitioned worker from holding a job for ever are documented there);
- producing.py -- enqueue (INSERT or COPY), unique keys, the steps shared with asyncio;
- leasing.py -- the claim, attempts, batches, savepoints, ``finish``, the claimed lease;
- operating.py -- reads, the read model, presence, cancel/retry/pause, prune, cron ticks;
- this module -- the schema (migrations) and the doors to the outbox and testing helpers.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ...errors import SchemaError
from .connecting import connect, row_of
from .leasing import Leasing
from .operating import Operating
from .queries import load_migrations
from .reads import PostgresReads


class PostgresBackend(Leasing, Operating, PostgresReads):
    """Every verb of ``base.Backend`` on PostgreSQL (see the module docstring for where each lives)."""

    # ---- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations in order, each recorded; safe to run concurrently."""
        bootstrap, migrations = load_migrations(self.schema)
        applied: list[int] = []
        with self._conn() as conn, conn.transaction():
            conn.execute(self.q["migrate_lock"], {"schema": self.schema})
            conn.execute(bootstrap)
            current = row_of(conn.execute(self.q["schema_version"]))[0] or 0
            latest = migrations[-1][0]
            if current > latest:
                raise SchemaError(self._newer_message(current, latest))
            for version, body in migrations:
                if version > current:
                    conn.execute(body)
                    conn.execute(self.q["record_version"], {"version": version})
                    applied.append(version)
        return applied

    def _newer_message(self, current: int, latest: int) -> str:
        return (
            f"the skiplock schema {self.schema!r} in this database is at version {current}, newer than this "
            f"skiplock knows (up to {latest}): upgrade skiplock"
        )

    def check_schema(self) -> None:
        latest = load_migrations(self.schema)[1][-1][0]
        with self._conn() as conn:
            try:
                current = row_of(conn.execute(self.q["schema_version"]))[0]
            except psycopg.errors.UndefinedTable:
                current = None
        if current is None:
            raise SchemaError(
                f"this database has no skiplock schema {self.schema!r} yet: run `skiplock migrate` (or app.migrate())"
            )
        if current > latest:
            raise SchemaError(self._newer_message(current, latest))
        if current < latest:
            raise SchemaError(
                f"the skiplock schema {self.schema!r} is at version {current}, this skiplock needs {latest}: "
                "run `skiplock migrate`"
            )

    def testing(self) -> Any:
        """What skiplock.testing does on this database (:class:`.testing.PostgresTesting`)."""
        from .testing import PostgresTesting

        return PostgresTesting(self, lambda name: connect(self.dsn, self.connect_timeout, autocommit=False,
                                                          application_name=name, **self._startup()))

    def async_leasing(self, max_connections: int) -> Any:
        """The asyncio worker's pool and lease verbs (:class:`.aio_leasing.AsyncLeasing`)."""
        from .aio_leasing import AsyncLeasing

        return AsyncLeasing(self, max_connections)

    def trace_store(self) -> Any:
        """The trace-context store (``tracing.py``), used only when tracing is on (``base.TraceStore``)."""
        from .tracing import PostgresTraceStore

        return PostgresTraceStore(self)

    def outbox_store(self) -> Any:
        """The outbox's operations on this database (:class:`.outbox.PostgresOutboxStore`)."""
        from .outbox import PostgresOutboxStore

        return PostgresOutboxStore(self)
