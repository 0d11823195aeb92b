"""The outbox tests that run on every backend (tests/outbox/test_outbox_backends.py): a :class:`Box` per
backend -- an App on a fresh, migrated database of that backend's server and the few test-side acts the
App does not offer (the caller's own connection, reading and ageing rows, counting lock waits) -- so
the tests themselves are the same code for PostgreSQL and MariaDB, as tests/conformance's are.

Entries: ``postgres`` (the embedded PostgreSQL, tests/conftest.py) and ``mariadb`` (the private MariaDB
10.11, tests/mariadb_server.py). Each test runs as ``test_x[postgres]`` and ``test_x[mariadb]``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import pytest

import skiplock


class Box:
    """An App on a fresh database of one backend, and test-side SQL on an admin session of its own."""

    name: str
    dsn: str
    app: skiplock.App
    outbox: str  # the outbox table's name in SQL
    jobs_table: str

    def connect(self, autocommit: bool = False) -> Any:
        """The caller's own driver connection (psycopg / PyMySQL), in a transaction unless autocommit."""
        raise NotImplementedError

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``%s`` placeholders, ``{outbox}``/``{jobs}`` table names) on the admin session."""
        raise NotImplementedError

    def ago(self, seconds: float) -> str:
        """SQL for "now less ``seconds``" in the database's clock."""
        raise NotImplementedError

    def session_id(self, conn: Any) -> int:
        """The server's id of a driver connection's session (what the backend's ``terminate`` takes)."""
        raise NotImplementedError

    def lock_waits(self) -> int:
        """Sessions of this database waiting on a row lock (or advisory lock) now."""
        raise NotImplementedError

    def seconds_until_available(self, message_id: int) -> float:
        raise NotImplementedError

    def close(self) -> None:
        self.app.close()

    # ---- shared ------------------------------------------------------------------------------

    def sql(self, text: str) -> str:
        return text.replace("{outbox}", self.outbox).replace("{jobs}", self.jobs_table)

    def states(self) -> dict[str, int]:
        return {s: int(n) for s, n in self.query("SELECT state, count(*) FROM {outbox} GROUP BY state")}

    def all_sent(self, n: int) -> bool:
        return self.states().get("sent", 0) == n

    def count(self) -> int:
        return int(self.query("SELECT count(*) FROM {outbox}")[0][0])

    def row(self, message_id: int) -> dict[str, Any]:
        record = self.app.outbox.store.get(message_id)
        assert record is not None, f"message {message_id} does not exist"
        return dict(record.__dict__)

    def expire_leases(self) -> None:
        self.query(f"UPDATE {{outbox}} SET lease_expires_at = {self.ago(1)} WHERE state = 'delivering'")

    def finished_ago(self, message_id: int, state: str, seconds: float) -> None:
        self.query(f"UPDATE {{outbox}} SET state = %s, finished_at = {self.ago(seconds)} WHERE id = %s",
                   (state, message_id))

    def jobs(self) -> list[tuple[str, Any]]:
        return [(task, json.loads(args) if isinstance(args, str) else args)
                for task, args in self.query("SELECT task, args FROM {jobs} ORDER BY id")]


class PostgresBox(Box):
    name = "postgres"
    outbox = "skiplock.outbox"
    jobs_table = "skiplock.jobs"

    def __init__(self, dsn: str):
        import psycopg

        self.dsn = dsn
        self.app = skiplock.App(dsn)
        self._admin = psycopg.connect(dsn, autocommit=True)

    def connect(self, autocommit: bool = False) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=autocommit)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self._admin.execute(self.sql(sql), params)
        return list(cur.fetchall()) if cur.description else []

    def ago(self, seconds: float) -> str:
        return f"now() - interval '{float(seconds)} seconds'"

    def session_id(self, conn: Any) -> int:
        return int(conn.info.backend_pid)

    def lock_waits(self) -> int:
        return int(self.query("SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0])

    def seconds_until_available(self, message_id: int) -> float:
        return float(self.query("SELECT extract(epoch FROM available_at - now()) FROM {outbox} WHERE id = %s",
                                (message_id,))[0][0])

    def close(self) -> None:
        super().close()
        self._admin.close()


class MariaDBBox(Box):
    name = "mariadb"
    outbox = "skiplock_outbox"
    jobs_table = "skiplock_jobs"

    def __init__(self, dsn: str):
        import pymysql

        from skiplock.backend.mysql.dsn import connect_args

        self.dsn = dsn
        self._args = connect_args(dsn)
        self.app = skiplock.App(dsn)
        self.app.migrate()
        self._admin = pymysql.connect(**self._args, autocommit=True)
        with self._admin.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")

    def connect(self, autocommit: bool = False) -> Any:
        import pymysql

        return pymysql.connect(**self._args, autocommit=autocommit)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._admin.cursor() as cur:
            cur.execute(self.sql(sql), params or None)
            return list(cur.fetchall())

    def ago(self, seconds: float) -> str:
        return f"UTC_TIMESTAMP(6) - INTERVAL {int(seconds * 1e6)} MICROSECOND"

    def session_id(self, conn: Any) -> int:
        return int(conn.thread_id())

    def lock_waits(self) -> int:
        # INNODB_TRX is a cache InnoDB refreshes only once it has not been read for 0.1 s: a caller
        # polling faster would read the same stale rows forever, so each read waits that long first.
        time.sleep(0.15)
        return int(self.query("SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")[0][0])

    def seconds_until_available(self, message_id: int) -> float:
        return float(self.query("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), available_at) / 1e6 "
                                "FROM {outbox} WHERE id = %s", (message_id,))[0][0])

    def close(self) -> None:
        super().close()
        self._admin.close()


def postgres(request: pytest.FixtureRequest) -> Box:
    return PostgresBox(request.getfixturevalue("dsn"))


def mariadb(request: pytest.FixtureRequest) -> Box:
    return MariaDBBox(request.getfixturevalue("mariadb_dsn"))


BACKENDS: list[Callable[[pytest.FixtureRequest], Box]] = [postgres, mariadb]
