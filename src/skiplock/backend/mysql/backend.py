"""MySQLBackend: the backend port (base.Backend) on MySQL 8.0.1+ / MariaDB 10.6+ through PyMySQL.

What it guarantees, as PostgresBackend does (docs/guarantees.md, docs/mysql.md):

- every session it opens runs at READ COMMITTED in UTC with a short ``innodb_lock_wait_timeout``
  (``session_setup``), and MariaDB's ``idle_transaction_timeout`` = ``lease_timeout`` where the
  server has it (pooled sessions too: a frozen rescuer's transaction cannot pin expired leases);
- the claim is ``SELECT … ORDER BY priority, run_at, id LIMIT n FOR UPDATE SKIP LOCKED`` on an index whose
  columns are its equality filters then exactly its ORDER BY; a deadlock (1213) or lock wait timeout
  (1205) during it rolls the whole attempt back and retries (a few times, with jitter);
- start-up refuses ``binlog_format = STATEMENT`` (SKIP LOCKED is unsafe for statement-based
  replication: the rows a replica would lock differ), warns on MIXED;
- migrations without transactional DDL: idempotent steps, recorded, serialised by GET_LOCK; a
  half-applied version is finished by ``migrate`` and reported by ``check_schema``;
- only skiplock errors leave it; no message or repr carries the password; identifiers are the
  validated, quoted table names of :func:`names`; every value is a bound parameter.

Not on this backend (docs/mysql.md): flow control and sequences (``Capabilities.flow_control``
is False: refused in one line), and the asyncio worker (it has no asyncio lease verbs:
``run_async_worker`` refuses this backend). ``AsyncApp`` enqueues, and the outbox puts, on the
caller's asyncio connection through ``run_async`` (producing.py, steps.py); the outbox is outbox.py.
"""

from __future__ import annotations

from typing import Any

from ...errors import DatabaseUnavailable, SchemaError

import pymysql

from .errors import code
from .leasing import Leasing
from .operating import Operating
from .producing import Producing
from .reads import MySQLReads
from .sql import migrations


ALREADY_THERE = frozenset({1060, 1061})  # duplicate column name, duplicate key name


class MySQLBackend(Leasing, Producing, Operating, MySQLReads):
    """The port on MySQL/MariaDB (see the module docstring), assembled from connections.py,
    producing.py, leasing.py, operating.py and reads.py (the dashboard's); the schema here."""

    # ---- schema --------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply what is missing, serialised across processes by GET_LOCK; returns the versions applied
        (a half-applied one included: its recorded steps are skipped, the rest run -- each idempotent)."""
        lock = f"skiplock:{self._args['database']}.{self.schema}"[:64]
        applied: list[int] = []
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, %s)", (lock, 60))
            if cur.fetchone()[0] != 1:
                raise DatabaseUnavailable(f"another process holds the migration lock {lock!r} for over 60 s")
            try:
                versions, steps_done = self._applied(cur)
                for version, steps in migrations(self.tables):
                    if version in versions:
                        continue
                    for name, sql in steps:
                        if (version, name) in steps_done:
                            continue
                        try:
                            cur.execute(sql)
                        except pymysql.err.MySQLError as exc:
                            # MySQL 8 has no ADD COLUMN/INDEX IF NOT EXISTS: a step cut after its
                            # DDL but before its record finds its column (1060) or index (1061) there
                            if code(exc) not in ALREADY_THERE:
                                raise
                        self._record_step(cur, version, name)  # done: not run again by a resumed migrate
                    cur.execute(f"INSERT IGNORE INTO {self.tables['schema_version']} (version, applied_at) "
                                "VALUES (%s, UTC_TIMESTAMP(6))", (version,))
                    applied.append(version)
            finally:
                cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
        return applied

    def _existing(self, cur: Any) -> set[str]:
        cur.execute("SELECT table_name FROM information_schema.TABLES WHERE table_schema = DATABASE()")
        prefix = f"{self.schema}_"
        return {r[0][len(prefix):] for r in cur.fetchall() if r[0].startswith(prefix)}

    def _record_step(self, cur: Any, version: int, name: str) -> None:
        cur.execute(f"INSERT IGNORE INTO {self.tables['migration_steps']} (version, step, done_at) "
                    "VALUES (%s, %s, UTC_TIMESTAMP(6))", (version, name))

    def _applied(self, cur: Any) -> tuple[set[int], set[tuple[int, str]]]:
        existing = self._existing(cur)
        versions: set[int] = set()
        steps: set[tuple[int, str]] = set()
        if "schema_version" in existing:
            cur.execute(f"SELECT version FROM {self.tables['schema_version']}")
            versions = {int(r[0]) for r in cur.fetchall()}
        if "migration_steps" in existing:
            cur.execute(f"SELECT version, step FROM {self.tables['migration_steps']}")
            steps = {(int(r[0]), r[1]) for r in cur.fetchall()}
        return versions, steps

    def check_schema(self) -> None:
        """SchemaError if the schema is missing, half-applied (named, with what to run), or newer."""
        with self._conn() as conn, conn.cursor() as cur:
            versions, steps = self._applied(cur)
        known = [v for v, _ in migrations(self.tables)]
        half = sorted({v for v, _ in steps} - versions)
        if half:
            raise SchemaError(f"the skiplock schema {self.schema!r} has a half-applied migration {half[0]} "
                              "(a migrate was interrupted): run `skiplock migrate` to finish it")
        if not versions:
            raise SchemaError(f"no skiplock schema {self.schema!r} in this database: run `skiplock migrate`")
        if max(versions) > max(known):
            raise SchemaError(f"the skiplock schema {self.schema!r} is at version {max(versions)}, newer than "
                              f"this skiplock ({max(known)}): upgrade skiplock")
        if set(known) - versions:
            raise SchemaError(f"the skiplock schema {self.schema!r} is at version {max(versions)}, this "
                              f"skiplock needs {max(known)}: run `skiplock migrate`")

    def testing(self) -> Any:
        """What skiplock.testing does on this database (testing.py)."""
        from .testing import MySQLTesting

        return MySQLTesting(self)

    def outbox_store(self) -> Any:
        """The transactional outbox's operations on this database (outbox.py, outbox.sql)."""
        from .outbox import MySQLOutboxStore

        return MySQLOutboxStore(self)

