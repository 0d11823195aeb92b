"""Plans the server keeps for the worker's hottest statements: each statement below used to be
planned anew at almost every run (its generic plan looked costlier than one made for the values at
hand), at 0.1-0.5 ms of server CPU each -- more than running it. These tests read the server's own
count of custom plans on the session (``pg_prepared_statements``): psycopg prepares a statement at
its sixth run, so runs 6 and later show there -- the claims and a batch's finishing write at their
first (``queries.prepare_now``), so every run shows."""

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


def _runs_keep_their_plans(app, one_run, lease_statement: str, bookkeeping_statement: str,
                           lease_custom: int = 0, lease_prepared_at: int = 6,
                           claim: tuple[str, int] | None = None) -> None:
    """``one_run(backend, lease, bookkeeping)`` RUNS times, each ending its lease transaction; then
    the lease's and the bookkeeping session's statements named by those fragments were planned for
    no run after psycopg prepared them (all generic) -- or, ``lease_custom`` 5, the lease's was
    planned for the server's first five runs of the prepared statement only (``auto`` mode: it then
    compares, and keeps the generic plan) -- and the lease's setting ended with each.
    ``lease_prepared_at``: the run at which the lease's statement was prepared (1: from its first,
    ``queries.prepare_now``). ``claim``: a (fragment, custom plans) of the lease's claim, prepared
    from its first run too."""
    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    bookkeeping = backend.connect_bookkeeping()
    try:
        for _ in range(RUNS):
            lease.begin()
            one_run(backend, lease, bookkeeping)
            assert lease.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"  # SET LOCAL ended
            lease.conn.commit()
        checks = [(lease.conn, lease_statement, lease_custom, lease_prepared_at),
                  (bookkeeping.conn, bookkeeping_statement, 0, 6)]
        if claim is not None:
            checks.append((lease.conn, claim[0], claim[1], 1))
        for conn, fragment, first_custom, prepared_at in checks:
            generic, custom = _plans(conn, fragment)
            runs = RUNS - (prepared_at - 1)
            assert custom == first_custom and generic == runs - first_custom, (fragment, generic, custom)
    finally:
        lease.close()
        bookkeeping.close()


@pytest.mark.parametrize("size", [1, 3, 8])
def test_a_batchs_bookkeeping_and_finishing_write_keep_their_plans(app, backlog, size):
    def batch(backend, lease, bookkeeping):
        jobs = backend.claim(lease, ["default"], limit=size, tasks=["t"])
        assert len(jobs) == size
        batch_id, suspects, cancels = backend.start_batch(bookkeeping, jobs, "w", lease.session_id)
        assert not suspects and not cancels
        written = backend.complete_batch(lease, batch_id, [(j, 1, None) for j in jobs], datetime.now(timezone.utc), "w")
        assert written == {j.id for j in jobs}  # (and committed)

    # the claim of a worker's size (a power of two, queries.with_limit; auto mode): the server's five
    # custom plans of the prepared statement, then generic
    claim = ("FOR UPDATE SKIP LOCKED", 5) if size & (size - 1) == 0 else None
    _runs_keep_their_plans(app, batch, 'UPDATE "skiplock".jobs j', 'INSERT INTO "skiplock".job_batches',
                           lease_prepared_at=1, claim=claim)


def test_a_lone_jobs_attempt_and_finishing_write_keep_their_plans(app, backlog):
    def lone(backend, lease, bookkeeping):
        job, = backend.claim(lease, ["default"], limit=1, tasks=["t"])
        attempt, cancelled, unrecorded, suspect = backend.start_attempt(bookkeeping, job, "w", lease.session_id,
                                                                        exclusive=False)
        assert (attempt, cancelled, unrecorded, suspect) == (1, None, None, False)
        assert backend.complete(lease.conn, job, attempt, None, datetime.now(timezone.utc), "w")
        lease.commit()

    # `complete` runs in auto mode (no SET LOCAL, one statement, no pipeline): its own text, not the
    # claimed lease's with a NULL owner, so the generic plan costs what the custom ones do
    _runs_keep_their_plans(app, lone, "WITH p AS MATERIALIZED", 'INSERT INTO "skiplock".job_attempts',
                           lease_custom=5)


def test_a_claimed_leases_finishing_write_keeps_its_plan(app, backlog):
    """``complete_claimed`` (fenced on the owner): the server keeps its generic plan too."""
    import uuid

    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    try:
        for _ in range(RUNS):
            lease.begin()
            job, = backend.claim(lease, ["default"], limit=1, tasks=["t"])
            owner = uuid.uuid4()
            assert backend.start_claimed(lease.conn, job, owner, 60.0, "w") is not None
            lease.conn.commit()
            assert backend.complete(lease.conn, job, 1, None, datetime.now(timezone.utc), "w", owner=owner)
            assert not backend.complete(lease.conn, job, 1, None, datetime.now(timezone.utc), "w", owner=owner)
            lease.conn.commit()
        generic, custom = _plans(lease.conn, "AND owner = $")
        assert custom == 5 and generic == 2 * RUNS - 10, (generic, custom)
    finally:
        lease.close()


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
