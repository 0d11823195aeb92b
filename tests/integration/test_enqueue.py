"""Enqueueing: in the caller's transaction, many in one statement, bad input refused with nothing written."""

from datetime import datetime, timedelta, timezone

import psycopg
import psycopg.sql
import pytest

from skiplock import InvalidJob


def _count(db) -> int:
    return db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0]


def test_enqueue_on_callers_connection_exists_only_if_committed(app, dsn, db):
    with psycopg.connect(dsn) as conn:
        app.enqueue("t", {"n": 1}, conn=conn)
        assert _count(db) == 0  # not visible before commit
        conn.rollback()
    assert _count(db) == 0
    with psycopg.connect(dsn) as conn:
        job_id = app.enqueue("t", {"n": 2}, conn=conn)
        conn.commit()
    assert app.get_job(job_id).args == {"n": 2}


class CountingCursor(psycopg.Cursor):
    statements = 0

    def execute(self, *args, **kwargs):  # type: ignore[override]
        type(self).statements += 1
        return super().execute(*args, **kwargs)


def test_enqueue_many_is_one_statement_and_keeps_input_order(app, dsn):
    with psycopg.connect(dsn, cursor_factory=CountingCursor) as conn:
        ids = app.enqueue_many([("t", {"i": i}, {"priority": i % 3, "queue": f"q{i % 2}"}) for i in range(500)],
                               conn=conn)
        conn.commit()
    assert CountingCursor.statements == 1
    assert ids == sorted(ids) and len(set(ids)) == 500
    job = app.get_job(ids[7])
    assert (job.args, job.priority, job.queue) == ({"i": 7}, 1, "q1")


def test_registered_task_defaults_apply(app):
    @app.task(name="mail", queue="emails", priority=3, max_attempts=7)
    def mail(job):
        pass

    job = app.get_job(app.enqueue("mail"))
    assert (job.queue, job.priority, job.max_attempts, job.state) == ("emails", 3, 7, "queued")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(args={"x": float("nan")}), "NaN"),
        (dict(args={"x": "\x00"}), "NUL"),
        (dict(args={"x": "y" * (2 << 20)}), "limit"),
        (dict(args={"x": {1}}), "serialisable"),
        (dict(args={}, queue=""), "queue"),
        (dict(args={}, priority=2**40), "priority"),
        (dict(args={}, max_attempts=0), "max_attempts"),
        (dict(args={}, delay=-1), "delay"),
        (dict(args={}, run_at=datetime(2030, 1, 1)), "timezone-aware"),
    ],
)
def test_bad_input_is_refused_and_the_callers_transaction_survives(app, dsn, db, kwargs, message):
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(InvalidJob, match=message):
            app.enqueue("t", conn=conn, **kwargs)
        conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is not aborted
        conn.commit()
    assert db.execute("SELECT count(*) FROM mine").fetchone()[0] == 1
    assert _count(db) == 0


def test_enqueue_many_refuses_the_whole_batch_on_one_bad_item(app, db):
    with pytest.raises(InvalidJob, match="item 1"):
        app.enqueue_many([("t", {}), ("t", {"x": float("nan")}), ("t", {})])
    assert _count(db) == 0


def test_run_at_and_delay_are_stored(app):
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    assert app.get_job(app.enqueue("t", run_at=when)).run_at == when
    delayed = app.get_job(app.enqueue("t", delay=120))
    assert delayed.run_at > datetime.now(timezone.utc) + timedelta(seconds=100)


def test_enqueue_on_a_dict_row_connection(app, dsn):
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        ids = [app.enqueue("t", conn=conn), *app.enqueue_many([("t", {})] * 2, conn=conn),
               app.enqueue("t", unique_key="u", conn=conn)]
        conn.commit()
    assert all(isinstance(i, int) for i in ids)


def test_a_pooled_connection_ended_by_the_server_is_replaced_not_used(app, db):
    """Right after use a pooled connection is not checked with a round trip; one whose session the
    server ended (restart, terminate) is still noticed (its socket has the server's goodbye to read)
    and replaced, so the enqueue succeeds."""
    first = app.enqueue("t", {"n": 1})
    pids = [r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'skiplock' "
                                     "AND datname = current_database()").fetchall()]
    assert pids
    db.execute("SELECT pg_terminate_backend(pid, 5000) FROM unnest(%s::int[]) AS p(pid)", [pids])
    second = app.enqueue("t", {"n": 2})
    assert second > first
    assert app.get_job(second).args == {"n": 2}
    now = {r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'skiplock' "
                                    "AND datname = current_database()").fetchall()}
    assert now and not now & set(pids)


def test_an_error_on_a_live_pooled_session_is_not_reported_as_a_lost_connection(app, db):
    """psycopg files deadlocks and cancelled statements under OperationalError, like a dropped
    connection; only the latter is DatabaseUnavailable (ConnectionLost). The former is a skiplock
    DatabaseError carrying the server's SQLSTATE -- never the driver's own exception."""
    from skiplock.errors import ConnectionLost, DatabaseError, DatabaseUnavailable

    db.execute(psycopg.sql.SQL("ALTER DATABASE {} SET statement_timeout = '50ms'").format(
        psycopg.sql.Identifier(db.info.dbname)))
    app.close()
    with pytest.raises(DatabaseError) as refused:
        with app.backend._conn() as conn:
            conn.execute("SELECT pg_sleep(1)")
    assert refused.value.sqlstate == "57014" and not isinstance(refused.value, DatabaseUnavailable)  # query_canceled
    with pytest.raises(ConnectionLost):
        with app.backend._conn() as conn:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
