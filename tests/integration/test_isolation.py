"""A database whose default isolation is REPEATABLE READ or SERIALIZABLE behaves like one at READ
COMMITTED (the claim protocol needs it): every connection skiplock opens sets its own isolation. A
deadlock or serialization failure is a database error recorded on the job (and retried), never taken
for a lost connection."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg import sql

import skiplock
from skiplock.backend.postgres.errors import connection_lost
from skiplock.worker.executor import Executor

from support import wait_for

LEVELS = ["serializable", "repeatable read"]


@pytest.fixture(params=LEVELS)
def strict_dsn(request, dsn, db):
    """The test database with ``default_transaction_isolation`` set to a level stricter than READ
    COMMITTED (new sessions pick it up)."""
    db.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
        sql.Identifier(db.info.dbname), sql.Literal(request.param)))
    with psycopg.connect(dsn) as check:
        assert check.execute("SHOW transaction_isolation").fetchone()[0] == request.param
    return dsn


@pytest.fixture
def strict_app(strict_dsn):
    a = skiplock.App(strict_dsn)
    yield a
    a.close()


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, attempt int NOT NULL)")
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
    db.execute("INSERT INTO accounts VALUES (1, 0), (2, 0)")
    return db


def test_every_skiplock_connection_runs_at_read_committed(strict_app, effects):
    seen = {}

    @strict_app.task(name="look")
    def look(job):
        seen["lease"] = job.conn.execute("SHOW transaction_isolation").fetchone()[0]

    strict_app.enqueue("look")
    strict_app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    backend = strict_app.backend
    assert seen["lease"] == "read committed"
    executor = Executor(strict_app, "test")
    try:
        assert executor.bookkeeping.run(lambda c: c.conn.execute("SHOW transaction_isolation").fetchone()[0]) \
            == "read committed"
    finally:
        executor.close()
    with backend._conn() as pooled:
        assert pooled.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
    with backend.connect_lease() as lease:
        assert lease.conn.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"


def test_concurrent_slots_claim_different_rows_and_drain_at_a_strict_default(strict_app, effects):
    """Two slots hold two different jobs at once (SKIP LOCKED), every handler's write commits with
    its job, no attempt is lost to a serialization failure and no slot 'reconnects'."""
    both_running = threading.Barrier(2, timeout=20)

    @strict_app.task(name="pair", max_attempts=1)
    def pair(job):
        both_running.wait()  # only returns once another slot holds the other job
        job.conn.execute("INSERT INTO effects VALUES (%s, %s)", [job.id, job.attempt])

    @strict_app.task(name="many", max_attempts=1)
    def many(job):
        job.conn.execute("INSERT INTO effects VALUES (%s, %s)", [job.id, job.attempt])
        job.conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")

    pair_ids = strict_app.enqueue_many([("pair", {})] * 2)
    ids = pair_ids + strict_app.enqueue_many([("many", {})] * 300)
    worker = strict_app.worker(concurrency=4, handle_signals=False, poll_interval=0.02)
    stats = worker.run(stop_when_empty=True)
    rows = effects.execute("SELECT state, attempts, count(*) FROM skiplock.jobs GROUP BY 1, 2").fetchall()
    assert rows == [("done", 1, len(ids))], rows
    assert stats.done == len(ids) and stats.reconnects == 0, stats
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY 1").fetchall())
    assert per_job == {i: 1 for i in ids}
    assert effects.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()[0] == 300


def _deadlock_tasks(app, barrier):
    def make(first: int, second: int):
        def handler(job):
            job.conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", [first])
            if job.attempt == 1:
                barrier.wait()  # both hold their first row: each now waits for the other's
            job.conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", [second])
        return handler

    app.task(name="one_then_two", max_attempts=3, retry=0)(make(1, 2))
    app.task(name="two_then_one", max_attempts=3, retry=0)(make(2, 1))


def test_a_deadlock_in_handlers_is_a_recorded_failed_attempt_then_retried(app, effects, db):
    db.execute(sql.SQL("ALTER DATABASE {} SET deadlock_timeout = '100ms'").format(sql.Identifier(db.info.dbname)))
    _deadlock_tasks(app, threading.Barrier(2, timeout=20))
    a = app.enqueue("one_then_two")
    b = app.enqueue("two_then_one")
    stats = app.worker(concurrency=2, handle_signals=False, poll_interval=0.02).run(stop_when_empty=True)
    jobs = {j: app.get_job(j) for j in (a, b)}
    assert {job.state for job in jobs.values()} == {"done"}
    # exactly one of them was chosen as the deadlock victim: attempt 1 failed with that error, attempt 2 done
    victims = [job for job in jobs.values() if job.attempts == 2]
    assert len(victims) == 1 and sorted(job.attempts for job in jobs.values()) == [1, 2], jobs
    (error,) = victims[0].errors
    assert error["attempt"] == 1 and error["error"].startswith("DeadlockDetected"), error
    assert stats.reconnects == 0 and stats.retried == 1, stats
    # both handlers' writes committed once each, the victim's first attempt rolled back
    assert db.execute("SELECT balance FROM accounts ORDER BY id").fetchall() == [(2,), (2,)]


def test_the_error_mapping_calls_only_a_gone_session_lost(dsn, db):
    """A deadlock and a serialization failure (real ones) are errors of a live session; a terminated
    session and one ended by idle_session_timeout are lost."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    db.execute("INSERT INTO t VALUES (1, 0), (2, 0)")
    errors: dict[str, BaseException] = {}

    # serialization failure: two SERIALIZABLE transactions with a read/write dependency cycle
    with psycopg.connect(dsn) as c1, psycopg.connect(dsn) as c2:
        for c in (c1, c2):
            c.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        c1.execute("SELECT sum(v) FROM t")
        c2.execute("SELECT sum(v) FROM t")
        c1.execute("UPDATE t SET v = v + 1 WHERE id = 1")
        c2.execute("UPDATE t SET v = v + 1 WHERE id = 2")
        c1.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as info:
            c2.commit()
        errors["serialization"] = info.value
        assert not c2.closed and not c2.broken

    # deadlock
    with psycopg.connect(dsn) as c1, psycopg.connect(dsn) as c2:
        c1.execute("SET deadlock_timeout = '50ms'")
        c2.execute("SET deadlock_timeout = '50ms'")
        c1.execute("UPDATE t SET v = v + 1 WHERE id = 1")
        c2.execute("UPDATE t SET v = v + 1 WHERE id = 2")
        box: dict[str, BaseException] = {}

        def cross(c, row):
            try:
                c.execute("UPDATE t SET v = v + 1 WHERE id = %s", [row])
            except psycopg.Error as exc:
                box[str(row)] = exc

        t = threading.Thread(target=cross, args=(c1, 2))
        t.start()
        cross(c2, 1)
        t.join(20)
        (errors["deadlock"],) = box.values()
        assert isinstance(errors["deadlock"], psycopg.errors.DeadlockDetected)

    # terminated session
    with psycopg.connect(dsn, autocommit=True) as victim:
        db.execute("SELECT pg_terminate_backend(%s, 5000)", [victim.info.backend_pid])
        with pytest.raises(psycopg.OperationalError) as info:
            victim.execute("SELECT 1")
        errors["terminated"] = info.value

    # idle_session_timeout
    with psycopg.connect(dsn, autocommit=True, options="-c idle_session_timeout=100") as idle:
        pid = idle.info.backend_pid
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0] == 0,
                 20, "the idle session to be ended")
        with pytest.raises(psycopg.OperationalError) as info:
            idle.execute("SELECT 1")
        errors["idle"] = info.value

    assert {k: connection_lost(e) for k, e in errors.items()} == {
        "serialization": False, "deadlock": False, "terminated": True, "idle": True}, \
        {k: (type(e).__name__, getattr(e, "sqlstate", None)) for k, e in errors.items()}


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_an_error_at_commit_is_a_recorded_failed_attempt(app, db, lease):
    """The server refuses the job's COMMIT on a live session (here a deferred foreign key the handler's
    write broke): the attempt is a failure with that error, recorded and retried, then failed."""
    db.execute("CREATE TABLE parents (id int PRIMARY KEY)")
    db.execute("CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)")

    @app.task(name="orphan", lease=lease, max_attempts=2, retry=0)
    def orphan(job):
        job.conn.execute("INSERT INTO children VALUES (42)")  # checked only at COMMIT

    job_id = app.enqueue("orphan")
    stats = app.worker(concurrency=1, handle_signals=False, poll_interval=0.02).run(stop_when_empty=True)
    job = app.get_job(job_id)
    assert (job.state, job.attempts) == ("failed", 2), job
    assert job.last_error.startswith("ForeignKeyViolation"), job.last_error
    assert [(e["attempt"], e["error"].split(":")[0]) for e in job.errors] == [(1, "ForeignKeyViolation"),
                                                                             (2, "ForeignKeyViolation")]
    assert stats.reconnects == 0, stats
    assert db.execute("SELECT count(*) FROM children").fetchone()[0] == 0
