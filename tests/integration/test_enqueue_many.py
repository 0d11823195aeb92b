"""enqueue_many of large batches (COPY): ids in input order, rows as given, one transaction, one wake-up."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.rows import dict_row

from skiplock import InvalidJob
from skiplock.errors import DatabaseError
from skiplock.backend.postgres.producing import COPY_MIN_JOBS

LARGE = COPY_MIN_JOBS + 500
# Text that COPY's text format must escape (tab, newline, carriage return, backslash), JSON escapes,
# the characters backslash-u-0-0-0-0 (not a NUL), and characters beyond Latin-1 and the BMP.
TRICKY = 'tab\there\nnew\rline back\\slash "quoted" \\u0000 é € 😀'


def _count(db) -> int:
    return db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0]


def recording_cursor() -> type[psycopg.Cursor]:
    """A cursor class that records the statements a connection sends (``execute`` and ``copy``)."""

    class Recording(psycopg.Cursor):
        sent: list[str] = []

        def execute(self, query, *args, **kwargs):  # type: ignore[override]
            type(self).sent.append("execute")
            return super().execute(query, *args, **kwargs)

        def copy(self, statement, *args, **kwargs):  # type: ignore[override]
            type(self).sent.append("copy")
            return super().copy(statement, *args, **kwargs)

    return Recording


def test_a_large_batch_stores_every_item_as_given_with_ids_in_input_order(app, db):
    when = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    items = []
    for i in range(LARGE):
        options = {"priority": i % 7 - 3, "max_attempts": 1 + i % 4, "queue": ("q\t\\" if i % 3 else "plain")}
        if i % 5 == 0:
            options["run_at"] = when + timedelta(seconds=i)
        items.append(("task\n" + str(i % 2), {"i": i, "s": TRICKY, "nested": {"list": [i, None, 1.5]}}, options))
    ids = app.enqueue_many(items)

    assert len(ids) == LARGE and ids == sorted(set(ids))  # ascending in input order, all distinct
    rows = db.execute("SELECT id, queue, task, args, priority, max_attempts, run_at, created_at, state "
                      "FROM skiplock.jobs ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ids
    created = {r[7] for r in rows}
    assert len(created) == 1  # one transaction
    for (task, args, options), row in zip(items, rows):
        _, queue, stored_task, stored_args, priority, max_attempts, run_at, created_at, state = row
        assert (stored_task, stored_args, queue, priority, max_attempts, state) == (
            task, args, options["queue"], options["priority"], options["max_attempts"], "queued")
        # no run_at: the transaction's now(), as in the INSERT path (created_at is that too)
        assert run_at == options.get("run_at", created_at)


def test_task_defaults_and_delay_apply_in_a_large_batch(app, db):
    @app.task(name="mail", queue="emails", priority=3, max_attempts=7)
    def mail(job, n):
        pass

    ids = app.enqueue_many([("mail", {"n": i}) for i in range(LARGE - 1)] + [("mail", {"n": -1}, {"delay": 3600})])
    rows = db.execute("SELECT queue, priority, max_attempts, run_at - created_at FROM skiplock.jobs "
                      "WHERE id = ANY(%s) ORDER BY id", [ids]).fetchall()
    assert set(rows[:-1]) == {("emails", 3, 7, timedelta(0))}
    assert rows[-1][:3] == ("emails", 3, 7) and rows[-1][3] > timedelta(minutes=59)


@pytest.mark.parametrize("n", [COPY_MIN_JOBS - 1, COPY_MIN_JOBS])
def test_the_copy_threshold_both_sides(app, dsn, db, n):
    cursor = recording_cursor()
    with psycopg.connect(dsn, cursor_factory=cursor) as conn:
        ids = app.enqueue_many([("t", {"i": i}) for i in range(n)], conn=conn)
        conn.commit()
    # below the threshold one INSERT statement; from it on, one statement reserving ids, then COPY
    assert cursor.sent == (["execute"] if n < COPY_MIN_JOBS else ["execute", "copy"])
    rows = db.execute("SELECT id, args->'i' FROM skiplock.jobs ORDER BY id").fetchall()
    assert rows == [(job_id, i) for i, job_id in enumerate(ids)]


def _forbid_queue(db) -> None:
    """A realistic server-side refusal that client-side checks cannot foresee: a CHECK on the table."""
    db.execute("ALTER TABLE skiplock.jobs ADD CONSTRAINT no_forbidden CHECK (queue <> 'forbidden')")


def _refused_late(n: int = 2 * COPY_MIN_JOBS) -> list[tuple]:
    """A large batch whose LAST row the server refuses, after all the others have been streamed."""
    return [("t", {"i": i}) for i in range(n - 1)] + [("t", {}, {"queue": "forbidden"})]


def test_a_batch_the_server_refuses_midway_leaves_nothing(app, db):
    _forbid_queue(db)
    with pytest.raises(DatabaseError, match="CheckViolation") as refused:  # a skiplock error, not the driver's
        app.enqueue_many(_refused_late())
    assert refused.value.sqlstate == "23514"  # check_violation
    assert _count(db) == 0
    assert len(app.enqueue_many([("t", {})] * LARGE)) == LARGE  # the pooled connection is fine
    assert _count(db) == LARGE


def test_on_an_autocommit_connection_the_batch_is_still_all_or_nothing(app, dsn, db):
    _forbid_queue(db)
    db.execute("LISTEN skiplock")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(DatabaseError, match="CheckViolation"):
            app.enqueue_many(_refused_late(), conn=conn)
        assert _count(db) == 0
        assert list(db.notifies(timeout=0.3)) == []  # the wake-up went with the failed transaction
        ids = app.enqueue_many([("t", {})] * LARGE, conn=conn)
        assert _count(db) == LARGE  # committed by the call: autocommit
        assert [n.payload for n in db.notifies(timeout=1.0)] == ["enqueued:skiplock"]
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert len(ids) == LARGE


def test_on_the_callers_connection_the_jobs_exist_only_if_the_caller_commits(app, dsn, db):
    db.execute("CREATE TABLE mine (x int)")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO mine VALUES (1)")
        app.enqueue_many([("t", {"i": i}) for i in range(LARGE)], conn=conn)
        assert _count(db) == 0  # not visible before commit
        conn.rollback()
    assert _count(db) == 0 and db.execute("SELECT count(*) FROM mine").fetchone()[0] == 0

    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO mine VALUES (2)")
        ids = app.enqueue_many([("t", {"i": i}) for i in range(LARGE)], conn=conn)
        conn.commit()
    assert _count(db) == LARGE and db.execute("SELECT x FROM mine").fetchall() == [(2,)]
    assert app.get_job(ids[-1]).args == {"i": LARGE - 1}


def test_a_server_refusal_aborts_the_callers_transaction_like_any_failed_statement(app, dsn, db):
    _forbid_queue(db)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(DatabaseError, match="CheckViolation"):
            app.enqueue_many(_refused_late(), conn=conn)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("INSERT INTO mine VALUES (1)")
        conn.rollback()
    assert _count(db) == 0


def test_a_bad_item_in_a_large_batch_is_refused_before_anything_is_sent(app, dsn, db):
    cursor = recording_cursor()
    items = [("t", {"i": i}) for i in range(LARGE)]
    bad = LARGE - 10
    items[bad] = ("t", {"x": float("nan")})
    with psycopg.connect(dsn, cursor_factory=cursor) as conn:
        conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(InvalidJob, match=f"item {bad}: args: .*NaN"):
            app.enqueue_many(items, conn=conn)
        assert cursor.sent == ["execute"]  # the CREATE TABLE only
        conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is not aborted
        conn.commit()
    assert _count(db) == 0 and db.execute("SELECT count(*) FROM mine").fetchone()[0] == 1


def test_one_wakeup_at_commit_and_none_after_a_rollback(app, dsn):
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listener.execute("LISTEN skiplock")
        app.enqueue_many([("t", {})] * LARGE, conn=conn)
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []  # nothing before commit
        conn.rollback()
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
        app.enqueue_many([("t", {})] * LARGE, conn=conn)
        conn.commit()
        assert [n.payload for n in listener.notifies(timeout=1.0)] == ["enqueued:skiplock"]


def test_workers_claim_and_run_copied_jobs(app, db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, n int NOT NULL, s text NOT NULL)")

    @app.task(name="effect")
    def effect(job, n, s):
        job.conn.execute("INSERT INTO effects VALUES (%s, %s, %s)", [job.id, n, s])

    ids = app.enqueue_many([("effect", {"n": i, "s": TRICKY}) for i in range(LARGE)])
    stats = app.worker(concurrency=2, handle_signals=False).run(stop_when_empty=True)
    assert stats.done == LARGE and stats.failed == 0
    effects = db.execute("SELECT job_id, n, s FROM effects").fetchall()
    assert sorted(effects) == [(job_id, i, TRICKY) for i, job_id in enumerate(ids)]
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done'").fetchone()[0] == 0


def test_a_connection_that_cannot_copy_safely_gets_the_insert(app, dsn, db):
    # pipeline mode cannot COPY; a Latin-1 client encoding could fail half-way through a COPY, where
    # the INSERT fails before sending anything and leaves the caller's transaction usable
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            ids = app.enqueue_many([("t", {"i": i}) for i in range(LARGE)], conn=conn)
        conn.commit()
    assert len(ids) == LARGE and _count(db) == LARGE
    with psycopg.connect(dsn) as conn:
        conn.execute("SET client_encoding TO 'LATIN1'")
        with pytest.raises(UnicodeEncodeError):
            app.enqueue_many([("t", {"s": "é"})] * (LARGE - 1) + [("t", {"s": "€"})], conn=conn)
        latin = app.enqueue_many([("t", {"s": "é"})] * LARGE, conn=conn)
        conn.commit()
    assert app.get_job(latin[0]).args == {"s": "é"} and _count(db) == 2 * LARGE


@pytest.mark.parametrize("kind", [{"row_factory": dict_row}, {"cursor_factory": psycopg.ClientCursor},
                                  {"autocommit": True, "row_factory": dict_row}])
def test_any_kind_of_callers_connection(app, dsn, db, kind):
    with psycopg.connect(dsn, **kind) as conn:
        ids = app.enqueue_many([("t", {"i": i}) for i in range(LARGE)], conn=conn)
        conn.commit()
    assert db.execute("SELECT array_agg(id ORDER BY id), array_agg((args->>'i')::int ORDER BY id) "
                      "FROM skiplock.jobs").fetchone() == (ids, list(range(LARGE)))
