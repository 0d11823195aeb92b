"""Migrations: idempotent, concurrent-safe, and clear errors for a missing or foreign schema version."""

import threading

import psycopg
import pytest

import skiplock
from skiplock import SchemaError
from skiplock.backend.postgres.queries import latest_version


def test_missing_schema_says_to_migrate(empty_dsn):
    app = skiplock.App(empty_dsn)
    with pytest.raises(SchemaError, match="skiplock migrate"):
        app.enqueue("t", {})
    app.close()


def test_newer_schema_says_to_upgrade(app, db):
    db.execute("INSERT INTO skiplock.schema_version (version) VALUES (999)")
    with pytest.raises(SchemaError, match="upgrade skiplock"):
        app.get_job(1)
    with pytest.raises(SchemaError, match="upgrade skiplock"):
        app.migrate()


def test_older_schema_says_to_migrate(app, db):
    db.execute("DELETE FROM skiplock.schema_version WHERE version = %s", [latest_version()])
    db.execute("INSERT INTO skiplock.schema_version (version) VALUES (0)")
    with pytest.raises(SchemaError, match="run `skiplock migrate`"):
        app.counts()


def test_concurrent_migrations_apply_once(empty_dsn):
    errors: list[BaseException] = []
    results: list[list[int]] = []

    def run() -> None:
        app = skiplock.App(empty_dsn)
        try:
            results.append(app.migrate())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            app.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(map(len, results)) == [0, 0, 0, latest_version()]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM skiplock.schema_version").fetchone()[0] == latest_version()


def test_hostile_schema_name_is_an_identifier_not_sql(empty_dsn):
    schema = 'we"ird; DROP TABLE x; --'
    app = skiplock.App(empty_dsn, schema=schema)
    app.migrate()

    @app.task(name="t")
    def t(job):
        return "ok"

    job_id = app.enqueue("t")
    app.worker(concurrency=1).run(stop_when_empty=True)
    assert app.get_job(job_id).result == "ok"
    app.close()
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()[0] == 1
