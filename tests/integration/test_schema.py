"""Migrations: idempotent, concurrent-safe, and clear errors for a missing or foreign schema version."""

import logging
import threading

import psycopg
import pytest

import skiplock
from skiplock import SchemaError
from skiplock.backend.postgres.queries import latest_version
from support import wait_for


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


# Names PostgreSQL accepts that are hard on string-built SQL: a "%" (a placeholder to psycopg in a
# statement with parameters), quotes, spaces, non-ASCII letters.
ODD_SCHEMA_NAMES = ["we%ird", "a%sb", "%(id)s", "100%", '"quoted"', "spa ce", "ünïcødé"]


def _exercise(dsn: str, schema: str) -> None:
    """Migrate, enqueue (one, many, keyed, COPY-sized), run a worker, complete and read jobs, put and
    read an outbox message, retry, count and prune -- all in ``schema``."""
    app = skiplock.App(dsn, schema=schema)

    @app.task(name="t")
    def t(job, n=0):
        job.conn.execute("SELECT 1")
        return n

    @app.task(name="boom", max_attempts=1)
    def boom(job):
        raise RuntimeError("boom")

    try:
        assert app.migrate()
        assert app.migrate() == []
        one = app.enqueue("t", {"n": 1})
        many = app.enqueue_many([("t", {"n": i}) for i in range(3)])
        keyed = app.enqueue("t", {"n": 7}, unique_key="k")
        assert app.enqueue("t", {"n": 8}, unique_key="k") == keyed
        app.enqueue_many([("t", {"n": i}, {"queue": "parked"}) for i in range(1000)])  # the COPY path
        failing = app.enqueue("boom")
        with psycopg.connect(dsn) as conn:  # on the caller's connection, in its transaction
            mine = app.enqueue("t", {"n": 9}, conn=conn)
            app.outbox.put("topic", {"x": 1}, conn=conn)
        app.worker(queues=["default"], concurrency=2, handle_signals=False).run(stop_when_empty=True)
        assert app.get_job(one).result == 1 and app.get_job(mine).result == 9
        assert [app.get_job(i).state.value for i in [*many, keyed]] == ["done"] * 4
        assert app.get_job(failing).state.value == "failed"
        assert app.retry_failed() == [failing]
        assert {(q, s) for q, s, _ in app.counts()} >= {("default", "done"), ("parked", "queued")}
        assert len(app.list_jobs(state="done")) == 5 + 1
        assert [m.topic for m in app.outbox.list_messages()] == ["topic"]
        app.prune({"done": 0})
        assert app.backend.jobs_vacuum_threshold() == 2000  # the background pruner's pass size, in this schema
    finally:
        app.close()
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()[0] == 1


@pytest.mark.parametrize("schema", ODD_SCHEMA_NAMES)
def test_any_schema_name_postgresql_accepts_works(empty_dsn, schema):
    _exercise(empty_dsn, schema)


def test_schema_name_length_is_counted_in_bytes(empty_dsn):
    """PostgreSQL keeps 63 bytes of a name: a longer one would be truncated, and two long names
    sharing their first 63 bytes would silently share tables. 63 bytes work; 64 are refused."""
    fits = "é" * 31 + "a"  # 63 bytes, 32 characters
    _exercise(empty_dsn, fits)
    for too_long in ("é" * 32, "é" * 31 + "ab", "x" * 64):  # 64 bytes (32, 33 and 64 characters)
        app = skiplock.App(empty_dsn, schema=too_long)
        with pytest.raises(skiplock.ConfigurationError, match="63 bytes"):
            app.migrate()
        app.close()
    for bad in ("", "a\x00b"):
        with pytest.raises(skiplock.ConfigurationError, match="schema"):
            skiplock.App(empty_dsn, schema=bad).migrate()


def test_a_running_worker_says_once_when_the_schema_changes_under_it(app, db, caplog):
    """A migration by a newer release while a worker runs (worker/schema_watch.py): one WARNING naming
    the versions, however many checks see it; the worker goes on running jobs; one INFO line once the
    versions match again."""
    caplog.set_level(logging.INFO, logger="skiplock.worker")
    app.task(name="noop")(lambda job: None)
    worker = app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False,
                        schema_check_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()

    def said(level: int, text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]

    try:
        worker.started.wait(10)
        db.execute("INSERT INTO skiplock.schema_version (version) VALUES (999)")
        wait_for(lambda: worker.schema is not None and worker.schema.problem is not None, what="the mismatch seen")
        assert "version 999" in worker.schema.problem and "upgrade skiplock" in worker.schema.problem
        job = app.enqueue("noop", {})  # (this app checked the schema before the change)
        wait_for(lambda: app.get_job(job).state == "done", what="a job run on the changed schema")
        watch = next(s for s in worker.services if s.name == "schema watch")
        seen = watch.passes
        wait_for(lambda: watch.passes >= seen + 3, what="three more checks")
        assert len(said(logging.WARNING, "schema changed while this worker runs")) == 1
        db.execute("DELETE FROM skiplock.schema_version WHERE version = 999")
        wait_for(lambda: worker.schema.problem is None, what="the versions matching again")
        assert len(said(logging.INFO, "matches this worker's skiplock again")) == 1
    finally:
        worker.stop()
        thread.join(30)


@pytest.mark.parametrize("seconds", [0, -1, float("inf"), float("nan"), True, "30"])
def test_the_schema_check_interval_must_be_a_positive_number_of_seconds(app, seconds):
    with pytest.raises(ValueError, match="schema_check_interval"):
        app.worker(schema_check_interval=seconds)
