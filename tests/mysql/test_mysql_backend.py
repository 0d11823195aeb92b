"""The MySQL/MariaDB backend's own guarantees on the private MariaDB (what the conformance suite does
not cover): the DSN picks it, migrations without transactional DDL, the claim's plan, deadlock retry,
binlog_format, errors without secrets."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest

from skiplock.backend import open_backend
from skiplock.backend.base import NewJob
from skiplock.backend.mysql import MySQLBackend
from skiplock.backend.mysql.sql import migrations, quote_identifier
from skiplock.errors import ConfigurationError, DatabaseUnavailable, SchemaError


def job(task: str = "t", queue: str = "default", priority: int = 0) -> NewJob:
    return NewJob(task, json.dumps({}), queue, priority, 3, None)


@pytest.fixture
def backend(mariadb_dsn: str) -> Iterator[MySQLBackend]:
    b = open_backend(mariadb_dsn)
    assert isinstance(b, MySQLBackend)
    b.migrate()
    yield b
    b.close()


@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
def test_open_backend_picks_mysql_for_both_schemes(mariadb_dsn: str, scheme: str) -> None:
    dsn = scheme + mariadb_dsn[len("mysql"):]
    b = open_backend(dsn)
    try:
        assert isinstance(b, MySQLBackend)
        b.migrate()
        b.check_schema()
    finally:
        b.close()


def test_no_password_in_errors_or_repr(mariadb_server: Any) -> None:
    dsn = mariadb_server.dsn("no_such_db_x").replace(mariadb_server.password, "s3cret-Pw")
    b = open_backend(dsn)
    assert "s3cret-Pw" not in repr(b)
    with pytest.raises(DatabaseUnavailable) as info:
        b.migrate()
    assert "s3cret-Pw" not in str(info.value) and "s3cret-Pw" not in repr(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None or "s3cret-Pw" not in repr(
        info.value.__context__)


def test_dsn_without_database_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="must name a database") as info:
        open_backend("mysql://u:topsecret@127.0.0.1:1/")
    assert "topsecret" not in str(info.value)


def test_identifier_quoting_is_strict() -> None:
    assert quote_identifier("skiplock_jobs") == "`skiplock_jobs`"
    for bad in ("a`b", "a b", "1a", "x" * 65, "", "a;drop"):
        with pytest.raises(ConfigurationError):
            quote_identifier(bad)
    with pytest.raises(ConfigurationError):
        MySQLBackend("mysql://u@h/db", schema="bad`name")


def test_migrate_is_idempotent_and_records_every_step(backend: MySQLBackend) -> None:
    assert backend.migrate() == []
    backend.check_schema()
    with backend._conn() as c, c.cursor() as cur:
        cur.execute(f"SELECT version, step FROM {backend.tables['migration_steps']}")
        recorded = set(cur.fetchall())
    assert recorded == {(v, name) for v, steps in migrations(backend.tables) for name, _ in steps}


def test_half_applied_migration_is_reported_then_finished(mariadb_dsn: str) -> None:
    """A migrate cut after some steps of a version: check_schema names it; migrate finishes it."""
    b = open_backend(mariadb_dsn)
    try:
        b.migrate()
        t = b.tables
        with b._conn() as c, c.cursor() as cur:  # as if cut after the first step of version 1
            cur.execute(f"DELETE FROM {t['schema_version']} WHERE version = 1")
            cur.execute(f"DELETE FROM {t['migration_steps']} WHERE version = 1 AND step <> 'jobs'")
            cur.execute(f"DROP TABLE {t['paused_queues']}")
        with pytest.raises(SchemaError, match="half-applied migration 1"):
            b.check_schema()
        assert b.migrate() == [1]
        b.check_schema()
        b.pause_queue("q")  # the table the cut left out exists again
        assert b.paused_queues() == ["q"]
    finally:
        b.close()


def test_missing_schema_is_a_schema_error(mariadb_dsn: str) -> None:
    b = open_backend(mariadb_dsn)
    try:
        with pytest.raises(SchemaError, match="skiplock migrate"):
            b.check_schema()
    finally:
        b.close()


def test_concurrent_migrates_serialise(mariadb_dsn: str) -> None:
    errors: list[BaseException] = []
    results: list[list[int]] = []

    def run() -> None:
        b = open_backend(mariadb_dsn)
        try:
            results.append(b.migrate())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            b.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    every = [v for v, _ in migrations(MySQLBackend('mysql://u@h/db').tables)]
    assert sorted(results, key=len) == [[], [], [], every]


@pytest.mark.parametrize("queues", [["default"], ["default", "other"], None])
def test_claim_plan_uses_the_index_without_filesort(backend: MySQLBackend, queues: Any) -> None:
    """EXPLAIN of each claim: the claim index, no filesort, no full scan (a filesort would lock every
    candidate row and serialise the workers)."""
    backend.enqueue([job(queue="default" if i % 3 else "other", priority=i % 5) for i in range(3000)])
    with backend._conn() as c, c.cursor() as cur:
        cur.execute(f"ANALYZE TABLE {backend.tables['jobs']}")
        cur.fetchall()
        if queues and len(queues) == 1:
            sql, params = backend.q["claim"], {"queue": queues[0], "limit": 1}
        else:
            sql, params = backend.q["claim_any_queue"], {"all_queues": 0 if queues else 1,
                                                         "queues": queues or [""], "all_tasks": 1,
                                                         "tasks": [""], "limit": 1}
        cur.execute("EXPLAIN " + sql, params)
        cols = [d[0] for d in cur.description]
        plan = [dict(zip(cols, r)) for r in cur.fetchall()]
    jobs_rows = [p for p in plan if p["table"] == "j" or str(p["table"]).endswith("jobs")]
    assert jobs_rows, plan
    for p in jobs_rows:
        assert "filesort" not in str(p["Extra"]), plan
        assert p["type"] != "ALL", plan
        assert p["key"] in ("jobs_claim", "jobs_claim_any"), plan


@pytest.mark.parametrize("queues", [["default"], None])
def test_a_claim_reads_no_entry_of_the_jobs_not_yet_due_ahead_of_it(backend: MySQLBackend, queues: Any) -> None:
    """2,000 jobs due in an hour (the lower ids) ahead of two due ones: the claim (one queue, every
    queue) reads a due job's index entry first -- the index is in (priority, run_at, id) order, as
    the claim -- not the 2,000 (before migration 7 it read each of them and dropped it: counted by the
    server's handler reads of this session)."""
    later = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(hours=1)
    backend.enqueue([NewJob("t", json.dumps({}), "default", 0, 3, later) for _ in range(2000)])
    due = backend.enqueue([job(), job()])
    with backend._conn() as c, c.cursor() as cur:
        cur.execute(f"ANALYZE TABLE {backend.tables['jobs']}")
        cur.fetchall()
        if queues:
            sql, params = backend.q["claim"], {"queue": queues[0], "limit": 1}
        else:
            sql, params = backend.q["claim_any_queue"], {"all_queues": 1, "queues": [""], "all_tasks": 1,
                                                         "tasks": [""], "limit": 1}

        def reads() -> int:
            cur.execute("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_next', 'Handler_read_key')")
            return sum(int(v) for _, v in cur.fetchall())

        before = reads()
        cur.execute(sql, params)
        claimed = [r[0] for r in cur.fetchall()]
        read = reads() - before
        c.rollback()
    assert claimed == due[:1]
    assert read <= 10, read


def test_statement_binlog_format_is_refused() -> None:
    """A server logging with binlog_format=STATEMENT is refused at start-up, saying why and what to set."""
    import mariadb_server

    server = mariadb_server.start(extra_args=["--log-bin=binlog", "--binlog-format=STATEMENT", "--server-id=1"])
    try:
        name = mariadb_server.fresh_database(server)
        b = open_backend(server.dsn(name))
        with pytest.raises(ConfigurationError, match="binlog_format=STATEMENT.*binlog_format=ROW"):
            b.migrate()
        with server.connect() as c, c.cursor() as cur:
            cur.execute("SET GLOBAL binlog_format = 'ROW'")
        b.close()
        b = open_backend(server.dsn(name))
        assert b.migrate() == [v for v, _ in migrations(b.tables)]
        b.close()
    finally:
        server.stop()
