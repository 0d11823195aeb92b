"""skiplock behind a real PgBouncer (tests/pgbouncer_server.py), in transaction pooling mode and in
session mode (``pooling``): what a pooler changes and what skiplock does about it (issue 15 item 4;
docs/deployment.md, "PgBouncer and poolers").

- A stock PgBouncer refuses the ``options`` startup parameter, which carries skiplock's session
  settings on a direct connection: behind a pooler they are sent another way (per transaction, with
  ``SET LOCAL``), so every connection works.
- A transaction pooler hands each transaction to any server session: no prepared statements, the lease
  bounds set per transaction, the lease's backend pid read per transaction, and no LISTEN through it
  (notifications would be silently lost): LISTEN goes to ``direct_dsn`` when given, else idle workers
  poll, and a WARNING says so.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

import skiplock
from support import wait_for


# The server session a lease's attempt (or batch) was recorded with -- what a cancellation ends.
RECORDED_PID = """SELECT coalesce((SELECT backend_pid FROM skiplock.job_attempts WHERE job_id = %(id)s),
                         (SELECT backend_pid FROM skiplock.job_batches WHERE ids @> ARRAY[%(id)s::bigint]))"""


def test_an_app_behind_pgbouncer_enqueues_and_drains_both_lease_modes(dsn: str, db: psycopg.Connection,
                                                                       pooling: str) -> None:
    db.execute("CREATE TABLE effects (job_id bigint PRIMARY KEY, pid int NOT NULL, recorded int)")
    app = skiplock.App(dsn)

    @app.task(name="txn")
    def txn(job: skiplock.Job) -> None:
        job.conn.execute("INSERT INTO effects VALUES (%(id)s, pg_backend_pid(), (" + RECORDED_PID + "))",
                         {"id": job.id})

    @app.task(name="claimed", lease="claimed", lease_seconds=5)
    def claimed(job: skiplock.Job) -> None:
        job.conn.execute("INSERT INTO effects VALUES (%s, pg_backend_pid())", [job.id])

    try:
        ids = app.enqueue_many([("txn", {})] * 30 + [("claimed", {})] * 30)
        stats = app.worker(concurrency=4).run(stop_when_empty=True)
        assert stats.done == 60, stats
        assert db.execute("SELECT count(*) FROM effects").fetchone()[0] == 60
        assert {app.get_job(i).state for i in ids} == {"done"}
        # each transaction-lease job was recorded with the server session it really ran on (behind a
        # transaction pooler, read per transaction: not libpq's pid, which is the pooler's)
        mismatched = db.execute("SELECT job_id, pid, recorded FROM effects WHERE job_id = ANY(%s) "
                                "AND recorded IS DISTINCT FROM pid", [ids[:30]]).fetchall()
        assert mismatched == []
    finally:
        app.close()


def test_the_pooler_and_its_mode_are_detected_and_what_changed_is_logged(
        dsn: str, direct_dsn: str, pooling: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skiplock.pooler")
    app, direct = skiplock.App(dsn), skiplock.App(direct_dsn)
    try:
        assert app.backend.pooling.mode == pooling
        assert direct.backend.pooling.mode == "direct"
        warnings = [r.getMessage() for r in caplog.records if r.name == "skiplock.pooler"]
        assert len(warnings) == 1, warnings
        assert f"behind a {pooling}-pooling connection pooler" in warnings[0]
        assert "SET LOCAL" in warnings[0] and "no prepared statements" in warnings[0]
        if pooling == "transaction":
            assert "idle workers, relays and waiters poll" in warnings[0]
        else:
            assert "LISTEN" not in warnings[0]
        assert "passfile" not in warnings[0] or "password" not in warnings[0].replace("passfile", "")
    finally:
        app.close()
        direct.close()


def test_no_statement_relies_on_a_prepared_statement_of_another_server_session(
        dsn: str, db: psycopg.Connection, pooling: str) -> None:
    """psycopg prepares a statement run five times on a connection; behind a transaction pooler the
    next run may reach a server session that never saw it (PgBouncer 1.18 does not track them)."""
    app = skiplock.App(dsn)
    try:
        job_id = app.enqueue("t", {})
        for _ in range(8):
            assert app.get_job(job_id).state == "queued"
        with psycopg.connect(dsn, prepare_threshold=None) as holder:
            holder.execute("SELECT 1")  # holds a server session (the one last released) in its transaction
            for _ in range(3):
                assert app.get_job(job_id).state == "queued"
            app.enqueue("t", {})
        assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 2
    finally:
        app.close()


def test_a_lease_s_bounds_stay_with_its_transaction(dsn: str, db: psycopg.Connection, pooling: str) -> None:
    """Set per transaction (SET LOCAL), the lease's idle_in_transaction_session_timeout does not stay
    on the server session for the pooler's next client."""
    default = db.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
    app = skiplock.App(dsn, lease_timeout=7)
    seen: list[str] = []

    @app.task(name="t")
    def t(job: skiplock.Job) -> None:
        seen.append(job.conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0])

    try:
        app.enqueue("t", {})
        app.worker(concurrency=1).run(stop_when_empty=True)
        assert seen == ["7s"]
        with psycopg.connect(dsn, prepare_threshold=None, autocommit=True) as other:
            assert other.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == default
    finally:
        app.close()


@pytest.mark.parametrize("listen", ["direct_dsn", "SKIPLOCK_DIRECT_DSN", "through the pooler"])
def test_idle_workers_are_woken_by_listen_where_it_works_else_they_poll(
        dsn: str, direct_dsn: str, pooling: str, listen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LISTEN on ``direct_dsn`` (or ``SKIPLOCK_DIRECT_DSN``) wakes idle workers in both modes; through a
    session pooler too; through a transaction pooler skiplock does not LISTEN at all (notifications
    would be lost silently): the workers poll, and still run every job."""
    if listen == "SKIPLOCK_DIRECT_DSN":
        monkeypatch.setenv("SKIPLOCK_DIRECT_DSN", direct_dsn)
    app = skiplock.App(dsn, direct_dsn=direct_dsn if listen == "direct_dsn" else None)
    done = threading.Event()

    @app.task(name="t")
    def t(job: skiplock.Job) -> None:
        done.set()

    woken = listen != "through the pooler" or pooling == "session"
    worker = app.worker(concurrency=1, poll_interval=60 if woken else 0.2)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: worker.listener is not None and worker.listener.listening.is_set(), 10, "the listener")
        time.sleep(0.2)
        app.enqueue("t", {})
        assert done.wait(20), "the job did not run"
        if woken:
            wait_for(lambda: worker.listener.notifications >= 1, 10, "a NOTIFY wake-up")
        else:
            assert worker.listener.notifications == 0
    finally:
        worker.stop()
        runner.join(30)
        app.close()


def test_statement_pooling_is_refused_with_one_clear_line(pg_admin_dsn: str, direct_dsn: str) -> None:
    """Statement pooling forbids multi-statement transactions, which every lease is: refused at the
    first connection, saying so (a skiplock error, never the driver's)."""
    import pgbouncer_server
    from psycopg import conninfo

    from skiplock.errors import ConfigurationError

    bouncer = pgbouncer_server.start(pg_admin_dsn, "statement")
    app = skiplock.App(bouncer.dsn(str(conninfo.conninfo_to_dict(direct_dsn)["dbname"])))
    try:
        with pytest.raises(ConfigurationError) as refused:
            app.enqueue("t", {})
        message = str(refused.value)
        assert "\n" not in message and "statement pooling" in message and "session or transaction" in message, message
    finally:
        app.close()
        bouncer.stop()
