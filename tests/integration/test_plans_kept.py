"""Plans the server keeps for the worker's hottest statements: each statement below used to be
planned anew at almost every run (its generic plan looked costlier than one made for the values at
hand), at 0.1-0.5 ms of server CPU each -- more than running it. These tests read the server's own
count of custom plans on the session (``pg_prepared_statements``): psycopg prepares a statement at
its sixth run, so runs 6 and later show there."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

RUNS = 16


def _plans(conn, fragment: str) -> tuple[int, int]:
    rows = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                        [f"%{fragment}%"]).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


@pytest.fixture
def backlog(db):
    """Enough queued jobs, analysed, for the server's estimates to be real ones."""
    db.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'default', 't' FROM generate_series(1, 5000)")
    db.execute("ANALYZE skiplock.jobs")


@pytest.mark.parametrize("size", [1, 3, 8])
def test_a_batchs_bookkeeping_and_finishing_write_keep_their_plans(app, backlog, size):
    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    bookkeeping = backend.connect_bookkeeping()
    try:
        for _ in range(RUNS):
            lease.begin()
            jobs = backend.claim(lease, ["default"], limit=size, tasks=["t"])
            assert len(jobs) == size
            batch, suspects, cancels = backend.start_batch(bookkeeping, jobs, "w", lease.session_id)
            assert not suspects and not cancels
            written = backend.complete_batch(lease, batch, [(j, 1, None) for j in jobs],
                                             datetime.now(timezone.utc), "w")
            assert written == {j.id for j in jobs}
            assert lease.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"  # SET LOCAL ended
            lease.conn.commit()
        generic, custom = _plans(lease.conn, "UPDATE \"skiplock\".jobs j")  # complete_batch
        assert custom == 0 and generic == RUNS - 5, (generic, custom)
        generic, custom = _plans(bookkeeping.conn, "INSERT INTO \"skiplock\".job_batches")  # start_batch
        assert custom == 0 and generic == RUNS - 5, (generic, custom)
    finally:
        lease.close()
        bookkeeping.close()


def test_a_lone_jobs_attempt_and_finishing_write_keep_their_plans(app, backlog):
    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    bookkeeping = backend.connect_bookkeeping()
    try:
        for _ in range(RUNS):
            lease.begin()
            job, = backend.claim(lease, ["default"], limit=1, tasks=["t"])
            attempt, cancelled, unrecorded, suspect = backend.start_attempt(bookkeeping, job, "w", lease.session_id,
                                                                            exclusive=False)
            assert (attempt, cancelled, unrecorded, suspect) == (1, None, None, False)
            assert backend.complete(lease.conn, job, attempt, None, datetime.now(timezone.utc), "w")
            lease.commit()
            assert lease.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"
            lease.conn.commit()
        generic, custom = _plans(lease.conn, "WITH p AS MATERIALIZED")  # complete
        assert custom == 0 and generic == RUNS - 5, (generic, custom)
        generic, custom = _plans(bookkeeping.conn, "INSERT INTO \"skiplock\".job_attempts")  # start_attempt
        assert custom == 0 and generic == RUNS - 5, (generic, custom)
    finally:
        lease.close()
        bookkeeping.close()


def test_a_handlers_statements_on_the_lease_are_planned_as_usual(app, backlog):
    """The finishing write's setting is the transaction's (SET LOCAL), after every handler: a
    handler's own statements never run under it, in its job's transaction or the next."""
    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    try:
        for _ in range(2):
            lease.begin()
            job, = backend.claim(lease, ["default"], limit=1, tasks=["t"])
            assert lease.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"  # what a handler sees
            assert backend.complete(lease.conn, job, 1, None, datetime.now(timezone.utc), "w")
            lease.commit()
    finally:
        lease.close()
