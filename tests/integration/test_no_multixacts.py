"""No job leaves a MultiXact behind, whether its handler touched the database or not (issue 16's
collapse).

A row locked FOR UPDATE by the lease transaction and then updated inside a subtransaction (a
savepoint) gets a MultiXact as its xmax, which every later claim stepping over that row version looks
up again in the MultiXact SLRU (it is never hinted) until vacuum prunes it: with many slots that
traffic was the drain's bottleneck. So a savepoint is taken only when a handler reads ``job.conn``,
and the job's row is always written by the top transaction: its savepoint released first (``done``),
or rolled back and released (any other outcome). (Until session 29 a handler that wrote had its
``done`` written inside its savepoint: one MultiXact per such job, 150-240 MultiXact SLRU reads per
job in a drain of 16 slots.) Counted with the server's own MultiXact counter
(``pg_control_checkpoint().next_multixact_id`` after a CHECKPOINT)."""

from __future__ import annotations

import psycopg
import pytest

from test_batches import whole  # claims are whole batches from the start


def next_multixact(db) -> int:
    db.execute("CHECKPOINT")
    return int(db.execute("SELECT next_multixact_id FROM pg_control_checkpoint()").fetchone()[0])


def drain(app, n: int, task: str, state: str = "done", **options) -> None:
    app.enqueue_many([(task, {"n": i}) for i in range(n)])
    app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False, **options).run(stop_when_empty=True)
    assert [(j.state.value) for j in app.list_jobs(limit=1000) if j.state.value != state] == []


@pytest.fixture
def tasks(app, db):
    db.execute("CREATE TABLE effects (n int)")

    @app.task(name="noop")
    def noop(job, n):
        return None

    @app.task(name="writes")
    def writes(job, n):
        job.conn.execute("INSERT INTO effects VALUES (%s)", [n])

    @app.task(name="writes_nested")
    def writes_nested(job, n):  # a savepoint of its own inside the job's, as an ORM session's
        with job.conn.transaction():
            job.conn.execute("INSERT INTO effects VALUES (%s)", [n])

    @app.task(name="writes_then_fails", max_attempts=1)
    def writes_then_fails(job, n):
        job.conn.execute("INSERT INTO effects VALUES (%s)", [n])
        raise RuntimeError("after its write")

    return app


@pytest.mark.parametrize("batch_size", [1, 16])
@pytest.mark.parametrize("task, state, effects", [("noop", "done", 0), ("writes", "done", 40),
                                                  ("writes_nested", "done", 40),
                                                  ("writes_then_fails", "failed", 0)])
def test_no_job_leaves_a_multixact(tasks, db, batch_size, task, state, effects):
    before = next_multixact(db)
    drain(tasks, 40, task, state, batch_policy=whole(batch_size))
    assert next_multixact(db) == before
    assert db.execute("SELECT count(*), count(DISTINCT n) FROM effects").fetchone() == (effects, effects)


def test_the_counter_does_see_a_row_locked_then_updated_in_a_savepoint(db, dsn):
    """The control: what the jobs no longer do, done by hand, moves the counter."""
    db.execute("CREATE TABLE lockme (id int PRIMARY KEY, v int)")
    db.execute("INSERT INTO lockme VALUES (1, 0)")
    before = next_multixact(db)
    with psycopg.connect(dsn) as c:
        c.execute("SELECT * FROM lockme WHERE id = 1 FOR UPDATE")
        c.execute("SAVEPOINT s")
        c.execute("UPDATE lockme SET v = 1 WHERE id = 1")
        c.execute("RELEASE SAVEPOINT s")
        c.commit()
    assert next_multixact(db) > before
