"""The seed's claim protocol through the backend: SKIP LOCKED, rollback as release, guarded writes."""

from datetime import datetime, timezone

import psycopg
import pytest

from skiplock.backend.base import ClaimedJob
from skiplock.backend.postgres.queries import with_limit

from support import positional


def _claim(app, conn) -> ClaimedJob | None:
    claimed = app.backend.claim(conn, ["default"])
    return claimed[0] if claimed else None


def test_two_lease_transactions_claim_different_rows_without_waiting(app, dsn):
    first, second = app.enqueue_many([("a", {}), ("b", {})])
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b, psycopg.connect(dsn) as c:
        for conn in (b, c):
            conn.execute("SET lock_timeout = '1s'")  # would raise instead of hanging on a lock
            conn.commit()
        assert _claim(app, a).id == first
        assert _claim(app, b).id == second
        assert _claim(app, c) is None  # both locked by others: nothing available, and no waiting


def test_rollback_makes_the_job_available_again(app, dsn):
    job_id = app.enqueue("a", {})
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        assert _claim(app, a).id == job_id
        assert _claim(app, b) is None
        b.rollback()
        a.rollback()
        assert _claim(app, b).id == job_id


def test_claim_order_is_priority_then_run_at_then_id_and_skips_future_run_at(app, dsn):
    later = app.enqueue("a", {}, delay=3600)
    low = app.enqueue("a", {}, priority=5)
    high = app.enqueue("a", {}, priority=-1)
    order = []
    with psycopg.connect(dsn) as a:
        while (job := _claim(app, a)) is not None:  # done at once, so the next claim moves on
            app.backend.complete(a, job, 1, None, job.claimed_at, "w")
            a.commit()
            order.append(job.id)
    assert order == [high, low]
    assert later not in order


@pytest.mark.parametrize("query, arg, index", [
    ("claim", "('default', 1)", "jobs_claim_idx"),
    ("claim_of_queues", "(ARRAY['default', 'x'], 1)", "jobs_claim_any_idx"),
    ("claim_any_queue", "(1)", "jobs_claim_any_idx"),
])
@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("limit", ["parameter", 1, 32])
def test_claim_is_an_index_scan_that_never_reads_finished_rows(app, db, query, arg, index, paused, limit):
    """A large history of finished jobs and a backlog: the claim walks the partial index in order --
    with the limit a parameter, and as the worker sends it (a literal: ``with_limit``), in the plan a
    prepared claim keeps (generic)."""
    db.execute("INSERT INTO skiplock.jobs (queue, task, state, finished_at, priority) "
               "SELECT 'default', 't', 'done', now(), g % 10 FROM generate_series(1, 20000) g")
    # a big backlog, all in one queue (that skew once misled the planner into seq scan + sort)
    db.execute("INSERT INTO skiplock.jobs (queue, task, priority) "
               "SELECT 'default', 't', g % 10 FROM generate_series(1, 100000) g")
    if paused:
        db.execute("INSERT INTO skiplock.paused_queues VALUES ('other')")
    db.execute("ANALYZE skiplock.jobs")
    with db.cursor() as cur:
        sql = app.backend.q[query] if limit == "parameter" else with_limit(app.backend.q[query], limit)
        sql = sql.replace("%(queues)s", "$1::text[]").replace("%(queue)s", "$1::text")
        if limit == "parameter":
            sql = sql.replace("%(limit)s", "$2::int" if "$1" in sql else "$1::int")
        else:
            arg = arg.replace(", 1)", ")") if arg != "(1)" else ""
        cur.execute("PREPARE claim AS " + sql)
        cur.execute("SET plan_cache_mode = force_generic_plan")  # what a prepared claim runs with
        plan = "\n".join(r[0] for r in cur.execute("EXPLAIN EXECUTE claim" + arg).fetchall())
    assert f"Index Scan using {index}" in plan, plan
    assert "Seq Scan on jobs" not in plan and "Sort" not in plan, plan


@pytest.mark.parametrize("query, args, index", [
    ("claim_tasks", {"queue": "'default'"}, "jobs_claim_idx"),
    ("claim_tasks_of_queues", {"queues": "ARRAY['default', 'x']"}, "jobs_claim_any_idx"),
    ("claim_tasks_any_queue", {}, "jobs_claim_any_idx"),
])
@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("plans", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("limit", ["parameter", 1, 32])
def test_the_workers_claim_checks_the_task_on_index_entries_in_claim_order(app, db, query, args, index, paused,
                                                                          plans, limit):
    """What a worker runs (its own tasks only), with another app's backlog of 100,000 queued jobs
    ahead of its ten: still an ordered walk of the partial index, and the task is checked on the index
    entry (an Index Cond), so the other app's jobs cost index entries, not a heap fetch each. Both with
    the plan a prepared claim runs with and with one made for the actual task names (what the first
    executions get)."""
    db.execute("INSERT INTO skiplock.jobs (queue, task, state, finished_at, priority) "
               "SELECT 'default', 't', 'done', now(), g % 10 FROM generate_series(1, 20000) g")
    db.execute("INSERT INTO skiplock.jobs (queue, task, priority) "
               "SELECT 'default', 'other.app', 0 FROM generate_series(1, 100000) g")
    db.execute("INSERT INTO skiplock.jobs (queue, task, priority) "
               "SELECT 'default', 't', 0 FROM generate_series(1, 10) g")
    if paused:
        db.execute("INSERT INTO skiplock.paused_queues VALUES ('other')")
    db.execute("ANALYZE skiplock.jobs")
    text = app.backend.q[query] if limit == "parameter" else with_limit(app.backend.q[query], limit)
    sql, names = positional(text)
    values = {**args, "tasks": "ARRAY['t', 'u']", "limit": "1"}
    with db.cursor() as cur:
        cur.execute("PREPARE claim AS " + sql)
        cur.execute(f"SET plan_cache_mode = {plans}")
        plan = "\n".join(r[0] for r in cur.execute(
            f"EXPLAIN EXECUTE claim({', '.join(values[n] for n in names)})").fetchall())
    assert f"Index Scan using {index}" in plan, plan
    assert "Seq Scan on jobs" not in plan and "Sort" not in plan, plan
    lines = plan.splitlines()
    scan = next(i for i, line in enumerate(lines) if f"Index Scan using {index}" in line)
    assert "Index Cond" in lines[scan + 1] and "task = ANY" in lines[scan + 1], plan


def test_the_workers_claim_takes_its_own_tasks_in_order_past_other_tasks(app, dsn):
    other = app.enqueue_many([("other.app", {})] * 3)
    mine = app.enqueue_many([("t", {}, {"priority": 1}), ("u", {}), ("t", {})])
    with psycopg.connect(dsn) as a:
        claimed = app.backend.claim(a, None, limit=5, tasks=["t", "u"])
        assert [j.id for j in claimed] == [mine[1], mine[2], mine[0]]  # priority, then id; none of other's
        a.rollback()
        assert [j.id for j in app.backend.claim(a, ["default"], limit=5, tasks=["u"])] == [mine[1]]
        a.rollback()
        assert [j.id for j in app.backend.claim(a, ["default", "x"], limit=5, tasks=["t"])] == [mine[2], mine[0]]
        a.rollback()
        assert [j.id for j in app.backend.claim(a, None, limit=1)] == [other[0]]  # every task: the unfiltered claim


def test_finished_job_cannot_be_resurrected_by_a_late_failure_record(app, dsn):
    """A lost COMMIT reply followed by a failure record must not turn a done job back."""
    job_id = app.enqueue("a", {})
    with psycopg.connect(dsn) as conn:
        claimed = _claim(app, conn)
        assert app.backend.complete(conn, claimed, 1, None, datetime.now(timezone.utc), "w")
        conn.commit()
    wrote = app.backend.record_outcome(None, claimed, 1, state="queued", delay=0, error="late",
                                       started_at=datetime.now(timezone.utc), worker="w")
    assert wrote is None
    job = app.get_job(job_id)
    assert job.state == "done" and job.last_error is None


def test_failure_record_never_waits_on_another_workers_lock(app, dsn):
    job_id = app.enqueue("a", {})
    with psycopg.connect(dsn) as holder:
        claimed = _claim(app, holder)
        # another worker holds the row: the fresh-transaction failure record skips instead of waiting
        wrote = app.backend.record_outcome(None, claimed, 1, state="queued", delay=0, error="x",
                                           started_at=datetime.now(timezone.utc), worker="w")
        assert wrote is None
        holder.rollback()
    assert app.get_job(job_id).state == "queued"


def test_lease_connections_carry_session_bounds(app):
    app.lease_timeout = 42
    backend = type(app.backend)(app.dsn, lease_timeout=42)
    conn = backend.connect_lease().conn
    try:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "42s"
        assert conn.execute("SHOW client_connection_check_interval").fetchone()[0] == "5s"
        if not (conn.info.host or "/").startswith("/"):  # TCP settings read 0 on a Unix socket
            assert conn.execute("SHOW tcp_user_timeout").fetchone()[0] == "30s"
        if conn.info.server_version >= 170000:
            assert conn.execute("SHOW transaction_timeout").fetchone()[0] == "42s"
        assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
    finally:
        conn.close()
        backend.close()


def test_batch_claim_locks_several_rows_in_order(app, dsn):
    ids = app.enqueue_many([("a", {})] * 5)
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        assert [j.id for j in app.backend.claim(a, ["default"], limit=3)] == ids[:3]
        assert [j.id for j in app.backend.claim(b, ["default"], limit=3)] == ids[3:]  # skips A's three


@pytest.mark.parametrize("limit", [1, 32])
def test_a_prepared_claim_keeps_its_plan_instead_of_planning_every_claim(app, dsn, db, limit):
    """With real statistics, the server kept no plan for a claim whose LIMIT was a parameter (the
    generic plan assumes a tenth of the table, so it never looked cheaper) and planned every claim
    anew -- more server CPU than running it. The claim the worker sends (``with_limit``) is planned
    for its first runs only: prepared from its first run (``queries.prepare_now``; psycopg alone
    prepares at the sixth), the server tries five custom plans, then keeps the generic one."""
    db.execute("INSERT INTO skiplock.jobs (queue, task, priority) "
               "SELECT 'default', 't', g % 10 FROM generate_series(1, 20000) g")
    db.execute("ANALYZE skiplock.jobs")
    with psycopg.connect(dsn) as conn:
        for _ in range(20):
            assert len(app.backend.claim(conn, ["default"], limit=limit, tasks=["t"])) == limit
            conn.commit()  # (a ROLLBACK would make psycopg drop its prepared statements)
        plans = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                             "WHERE statement LIKE '%%SKIP LOCKED%%'").fetchall()
    assert len(plans) == 1, plans
    generic, custom = plans[0]
    assert custom == 5 and generic == 15, plans  # 20 runs: 5 custom plans, then the kept one


def test_a_claim_that_found_nothing_ends_without_losing_the_prepared_claims(app, db):
    """A slot's empty claim ends with ``let_go`` (COMMIT): after a ROLLBACK psycopg drops every
    prepared statement of the connection, and the claims after it would be planned anew."""
    db.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'default', 't' FROM generate_series(1, 100)")
    lease = app.backend.connect_lease("skiplock-test")
    try:
        def prepared() -> int:
            return lease.conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]

        for _ in range(8):
            lease.begin()
            assert app.backend.claim(lease, ["default"], limit=2, tasks=["t"])
            lease.commit()
        assert prepared() == 1
        lease.conn.commit()
        for _ in range(3):  # a queue with nothing in it: the same claim, empty
            lease.begin()
            assert app.backend.claim(lease, ["empty"], limit=2, tasks=["t"]) == []
            lease.let_go()
            assert not lease.in_transaction()
            assert prepared() == 1
            lease.conn.commit()
        lease.begin()
        assert app.backend.claim(lease, ["empty"], limit=2, tasks=["t"]) == []
        lease.rollback()  # what an empty claim used to end with
        assert prepared() == 0
    finally:
        lease.close()
