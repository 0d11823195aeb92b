"""A handler that does not touch the database leaves no MultiXact behind (issue 16's collapse).

A row locked FOR UPDATE by the lease transaction and then updated inside a subtransaction (a
savepoint) gets a MultiXact as its xmax, which every later claim stepping over that row version looks
up again in the MultiXact SLRU (it is never hinted) until vacuum prunes it: with many slots that
traffic was the drain's bottleneck. So a savepoint is taken only when a handler reads ``job.conn``,
and is released once its job is written. Counted with the server's own MultiXact counter
(``pg_control_checkpoint().next_multixact_id`` after a CHECKPOINT)."""

from __future__ import annotations

import pytest

from test_batches import whole  # claims are whole batches from the start


def next_multixact(db) -> int:
    db.execute("CHECKPOINT")
    return int(db.execute("SELECT next_multixact_id FROM pg_control_checkpoint()").fetchone()[0])


def drain(app, n: int, task: str, **options) -> None:
    app.enqueue_many([(task, {"n": i}) for i in range(n)])
    app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False, **options).run(stop_when_empty=True)
    assert [(j.state.value) for j in app.list_jobs(limit=1000) if j.state.value != "done"] == []


@pytest.fixture
def tasks(app, db):
    db.execute("CREATE TABLE effects (n int)")

    @app.task(name="noop")
    def noop(job, n):
        return None

    @app.task(name="writes")
    def writes(job, n):
        job.conn.execute("INSERT INTO effects VALUES (%s)", [n])

    return app


@pytest.mark.parametrize("batch_size", [1, 16])
def test_jobs_that_do_not_touch_the_database_create_no_multixact(tasks, db, batch_size):
    before = next_multixact(db)
    drain(tasks, 40, "noop", batch_policy=whole(batch_size))
    assert next_multixact(db) == before


def test_the_counter_does_see_the_multixacts_of_jobs_that_write(tasks, db):
    """The control: a handler's writes need its savepoint, and its completion inside it makes one."""
    before = next_multixact(db)
    drain(tasks, 10, "writes", batch_policy=whole(4))
    assert next_multixact(db) > before
    assert db.execute("SELECT count(*) FROM effects").fetchone()[0] == 10
