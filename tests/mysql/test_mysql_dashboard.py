"""The dashboard's statements on the MySQL backend (backend/mysql/reads.py, the dashboard section of
queries.sql), on the private MariaDB: bounded at any table size -- checked on the server's own
execution (ANALYZE FORMAT=JSON: the rows each read of the jobs table examined) and plan (EXPLAIN: the
index, no filesort), never by timing --, the statement time limit set and put back, the queue summary
exact up to its cap then estimated, the bulk delete that never waits and never deletes a live job,
throughput per minute, and the args search window by window. The pages themselves run on both
backends in tests/dashboard (test_web.py, test_pages.py)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest

import skiplock
from skiplock import job_reads
from skiplock.backend.mysql import MySQLBackend
from skiplock.errors import DatabaseError
from skiplock.readmodel import BoundedCount, JobFilter

FILTER = {k: None for k in ("state", "queue", "task", "error_class", "since", "until", "args", "id_floor",
                            "before")}


@pytest.fixture
def app(mariadb_dsn: str) -> Iterator[skiplock.App]:
    a = skiplock.App(mariadb_dsn)
    a.migrate()
    yield a
    a.close()


@pytest.fixture
def backend(app: skiplock.App) -> MySQLBackend:
    return app.read_model.backend  # type: ignore[no-any-return]


def sql(backend: MySQLBackend, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Test-side SQL on one of the backend's pooled sessions (autocommit)."""
    with backend._conn() as c, c.cursor() as cur:
        cur.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []


def insert(backend: MySQLBackend, n: int, *, queue: str = "default", state: str = "queued",
           args: str = '{"k": 1}', run_at: str = "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE", priority: int = 0,
           finished: str = "UTC_TIMESTAMP(6)") -> None:
    """``n`` jobs in one statement (an App would take a round trip each)."""
    finished_at = finished if state in ("done", "failed", "cancelled") else "NULL"
    for chunk in range(0, n, 1000):  # the private server's max_recursive_iterations is 1000
        sql(backend, "INSERT INTO skiplock_jobs (queue, task, state, args, run_at, created_at, errors, priority, "
                     "finished_at) WITH RECURSIVE seq (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < %s) "
                     f"SELECT %s, 'noop', %s, %s, {run_at}, UTC_TIMESTAMP(6), '[]', %s, {finished_at} FROM seq",
            (min(1000, n - chunk), queue, state, args, priority))
    sql(backend, "ANALYZE TABLE skiplock_jobs")


def rows_examined(backend: MySQLBackend, name: str, params: dict[str, Any]) -> int:
    """How many rows of the jobs table the statement ``name`` read when run: every read of it in the
    server's ANALYZE FORMAT=JSON (r_rows per loop times r_loops), derived tables and subqueries too."""
    plan = json.loads(sql(backend, "ANALYZE FORMAT=JSON " + backend.q[name], params)[0][0])

    def walk(node: Any) -> int:
        if isinstance(node, list):
            return sum(walk(x) for x in node)
        if not isinstance(node, dict):
            return 0
        own = 0
        if node.get("table_name") in ("skiplock_jobs", "j", "x") and "r_rows" in node:
            own = int(round(float(node["r_rows"] or 0) * float(node.get("r_loops", 1) or 0)))
        return own + sum(walk(v) for v in node.values())

    return walk(plan)


def plan_of(backend: MySQLBackend, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with backend._conn() as c, c.cursor() as cur:
        cur.execute(backend.q[name] if name == "dash_pair_estimate" else "EXPLAIN " + backend.q[name], params)
        columns = [d[0].lower() for d in cur.description]
        return [dict(zip(columns, r)) for r in cur.fetchall()]


# ---- bounded at any table size -----------------------------------------------------------------

def test_dashboard_statements_read_a_bounded_number_of_rows(backend: MySQLBackend) -> None:
    insert(backend, 6000, queue="a")
    insert(backend, 6000, queue="b", state="done", finished="UTC_TIMESTAMP(6) - INTERVAL 2 DAY")
    insert(backend, 3000, queue="b", state="failed", finished="UTC_TIMESTAMP(6) - INTERVAL 2 DAY")
    insert(backend, 40, queue="b", state="done")  # finished within the hour
    cap = 10
    for queue, state in [("a", "queued"), ("b", "done"), ("b", "failed")]:
        assert rows_examined(backend, "dash_pair_count", {"state": state, "queue": queue, "cap": cap + 1}) <= cap + 1
    # the loose index scan: a probe per (state, queue) pair, not the 15,000 entries
    assert rows_examined(backend, "dash_queue_pairs", {}) <= 3 * 2 + 2
    assert "Using index for group-by" in plan_of(backend, "dash_queue_pairs", {})[0]["extra"]
    ready = {"queue": "a", "in_flight": [0], "cap": cap + 1}
    assert rows_examined(backend, "dash_ready_count", ready) <= cap + 1
    assert rows_examined(backend, "dash_queue_head", ready) <= 1
    # throughput: the jobs finished within the hour, not the 9,000 older ones
    assert rows_examined(backend, "dash_throughput", {"seconds_us": 3600 * 10**6}) <= 40 + 3
    # a page of the newest jobs, and an args search of one window of ids
    assert rows_examined(backend, "dash_find_jobs", dict(FILTER, limit=50)) <= 50
    top = int(sql(backend, "SELECT MAX(id) + 1 FROM skiplock_jobs")[0][0])
    assert rows_examined(backend, "dash_find_jobs", dict(FILTER, args="needle", id_floor=top - 1000, limit=50)) <= 1001
    # the exact statement the read model would otherwise use reads every row
    assert rows_examined(backend, "counts", {}) >= 15_000


def test_dashboard_plans_walk_their_index_in_order(backend: MySQLBackend) -> None:
    """The plan's shape: the job list walks the primary key (no filesort of a state's rows through
    jobs_claim_any), the queue summary's reads are ranges of jobs_claim in the claim's order, the
    throughput a range of jobs_finished."""
    insert(backend, 3000, queue="a", state="done")
    insert(backend, 50, queue="a")
    for state in (None, "done", "queued", "running"):
        (row, *_) = plan_of(backend, "dash_find_jobs", dict(FILTER, state=state, limit=50))
        assert row["key"] == "PRIMARY" and "filesort" not in (row["extra"] or ""), row
        (row, *_) = plan_of(backend, "dash_find_jobs", dict(FILTER, state=state, limit=1000))  # a bulk action's
        assert row["key"] == "PRIMARY" and "filesort" not in (row["extra"] or ""), row
    for name in ("dash_queue_pairs", "dash_pair_count", "dash_ready_count", "dash_queue_head"):
        params = {"state": "queued", "queue": "a", "in_flight": [0], "cap": 11, "after": "0"}
        rows = [r for r in plan_of(backend, name, params) if r["table"] == "skiplock_jobs"]
        assert rows and all(r["key"] == "jobs_claim" and "filesort" not in (r["extra"] or "") for r in rows), rows
    (row,) = plan_of(backend, "dash_throughput", {"seconds_us": 3600 * 10**6})
    assert row["key"] == "jobs_finished" and row["type"] == "range", row
    # the queue latency: the same range, the index covering run_at and started_at (no row lookups)
    (row,) = [r for r in plan_of(backend, "dash_pickup_latency", {"seconds_us": 3600 * 10**6})
              if r["table"] == "skiplock_jobs"]
    assert row["key"] == "jobs_finished" and "Using index" in (row["extra"] or ""), row
    (row,) = plan_of(backend, "dash_lock_finished", {"ids": [1, 2, 3]})  # each id looked up, never a scan
    assert row["key"] == "PRIMARY" and row["type"] == "range", row
    for name in ("dash_delete_finished", "dash_delete_attempts"):
        (row,) = plan_of(backend, name, {"id": 1})
        assert row["key"] == "PRIMARY" and row["type"] in ("range", "const"), row


def test_the_statement_time_limit_ends_a_long_statement_and_is_put_back(backend: MySQLBackend) -> None:
    backend.dashboard_timeout_ms = 200
    backend.q = dict(backend.q, dash_test_sleep="SELECT SLEEP(30)")  # stands for a slow page's statement
    with pytest.raises(DatabaseError) as caught:
        backend._bounded("dash_test_sleep", {})
    assert "max_statement_time" in str(caught.value) or "interrupted" in str(caught.value).lower(), caught.value
    # every pooled session is back at the server's default: nothing else is bounded by the dashboard's limit
    assert backend._time_limit == "mariadb"
    for _ in range(backend.pool_size + 1):
        assert float(sql(backend, "SELECT @@SESSION.max_statement_time")[0][0]) == 0.0
    assert backend.find_jobs({}, None, 5) == []  # the session still serves


# ---- the queue summary -------------------------------------------------------------------------

def test_queue_summary_exact_up_to_the_cap_then_estimated(app: skiplock.App, backend: MySQLBackend) -> None:
    insert(backend, 7, queue="a")                                                   # due
    insert(backend, 2, queue="a", run_at="UTC_TIMESTAMP(6) + INTERVAL 1 HOUR")      # not yet due
    insert(backend, 1, queue="a", priority=-1, run_at="UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")  # claimed first
    insert(backend, 3, queue="b", state="failed")
    insert(backend, 1, queue="b", state="done")
    app.pause_queue("c", force=True)
    by_queue = {q.queue: q for q in app.read_model.queue_summary(cap=5)}
    assert sorted(by_queue) == ["a", "b", "c"]
    a, b, c = by_queue["a"], by_queue["b"], by_queue["c"]
    # above the cap: "more than 5", with the optimiser's estimate (an index dive: here the exact figure)
    assert a.counts["queued"].n == 5 and a.counts["queued"].exact is False
    assert a.counts["queued"].estimate is not None and 5 < a.counts["queued"].estimate <= 20
    assert a.ready.exact is False and a.ready.n == 5
    # the head is the job claimed next (priority -1), not the one due longest
    assert a.head_age is not None and a.head_age < timedelta(seconds=30) and not a.paused
    assert b.counts["failed"] == BoundedCount(3) and b.counts["done"] == BoundedCount(1)
    assert b.counts["queued"] == BoundedCount(0) and b.head_age is None
    assert c.paused and all(n == BoundedCount(0) for n in c.counts.values())
    # under a large cap every figure is exact and agrees with the exact (full-scan) counts
    exact = {(q.queue, s): n.n for q in app.read_model.queue_summary(cap=1000) for s, n in q.counts.items() if n.n}
    assert exact == {(x.queue, x.state): x.count for x in app.read_model.counts()}


def test_a_transaction_lease_job_in_flight_counts_as_running(app: skiplock.App) -> None:
    gate, started = threading.Event(), threading.Event()

    @app.task(name="hold")
    def hold(job: Any) -> None:
        started.set()
        gate.wait(60)

    held = app.enqueue("hold", queue="q")
    app.enqueue("hold", queue="q", delay=3600)
    worker = app.worker(queues=["q"], concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        # INNODB_TRX is a cache refreshed once unread for 0.1 s (see test_pages.py's IN_FLIGHT_POLL)
        for _ in range(200):
            (q,) = app.read_model.queue_summary(cap=10)
            if q.counts["running"].n == 1:
                break
            threading.Event().wait(0.25)
        assert q.counts["running"] == BoundedCount(1) and q.counts["queued"] == BoundedCount(1), q
        assert q.ready == BoundedCount(0) and q.head_age is None  # the other one is not due
        assert [r.id for r in app.read_model.find_jobs(JobFilter(state="running")).items] == [held]
        assert held not in [r.id for r in app.read_model.find_jobs(JobFilter(state="queued")).items]
        assert app.read_model.matching_ids(JobFilter(state="running")) == [held]
    finally:
        gate.set()
        worker.stop()
        thread.join(30)


# ---- bulk delete, throughput, args search -------------------------------------------------------

def test_delete_finished_jobs_skips_live_and_locked_rows_without_waiting(app: skiplock.App,
                                                                         backend: MySQLBackend) -> None:
    insert(backend, 3, state="done")
    insert(backend, 1, state="failed")
    insert(backend, 1, state="queued")
    ids = [int(r[0]) for r in sql(backend, "SELECT id FROM skiplock_jobs ORDER BY id")]
    done_a, done_b, done_c, failed, queued = ids
    sql(backend, "INSERT INTO skiplock_job_attempts (job_id, started, started_at) VALUES (%s, 1, UTC_TIMESTAMP(6))",
        (failed,))
    other = backend._connect(autocommit=False)  # another transaction holds done_b
    try:
        with other.cursor() as cur:
            cur.execute("SELECT id FROM skiplock_jobs WHERE id = %s FOR UPDATE", (done_b,))
            assert backend.delete_finished_jobs(ids) == [done_a, done_c, failed]
    finally:
        other.rollback()
        other.close()
    left = [int(r[0]) for r in sql(backend, "SELECT id FROM skiplock_jobs ORDER BY id")]
    assert left == [done_b, queued]
    assert sql(backend, "SELECT job_id FROM skiplock_job_attempts") == []
    assert backend.delete_finished_jobs([]) == [] and backend.delete_finished_jobs([queued]) == []


def test_throughput_per_minute_by_outcome(backend: MySQLBackend) -> None:
    minute = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=10)
    at = minute.replace(tzinfo=None)
    for state, n, offset in [("done", 3, 5), ("failed", 2, 59), ("cancelled", 1, 30)]:
        insert(backend, n, state=state, finished=f"TIMESTAMP '{at + timedelta(seconds=offset)}'")
    insert(backend, 4, state="done", finished=f"TIMESTAMP '{at + timedelta(minutes=1, seconds=1)}'")
    insert(backend, 7, state="done", finished="UTC_TIMESTAMP(6) - INTERVAL 2 HOUR")  # outside the hour
    got = backend.throughput(3600)
    assert got == [(minute, 3, 2, 1), (minute + timedelta(minutes=1), 4, 0, 0)]
    assert all(m.tzinfo is not None for m, *_ in got)


def test_pickup_latency_as_percentile_cont(app: skiplock.App, backend: MySQLBackend) -> None:
    assert backend.pickup_latency(3600) == (None, None, None, 0)
    for wait in (1, 2, 3, 4.5):  # due 10 s ago, started `wait` seconds later, finished now
        insert(backend, 1, state="done", run_at="UTC_TIMESTAMP(6) - INTERVAL 10 SECOND")
        sql(backend, "UPDATE skiplock_jobs SET started_at = run_at + INTERVAL %s MICROSECOND "
                     "WHERE id = (SELECT MAX(id) FROM skiplock_jobs)", (int(wait * 1_000_000),))
    insert(backend, 1, state="done", run_at="UTC_TIMESTAMP(6) - INTERVAL 3 HOUR",
           finished="UTC_TIMESTAMP(6) - INTERVAL 2 HOUR")  # outside the hour: not counted
    sql(backend, "UPDATE skiplock_jobs SET started_at = run_at WHERE started_at IS NULL AND state = 'done'")
    median, p95, worst, n = backend.pickup_latency(3600)
    # percentile_cont over [1, 2, 3, 4.5]: positions 1.5 and 2.85
    assert n == 4 and median == pytest.approx(2.5) and p95 == pytest.approx(3 + 0.85 * 1.5) and worst == 4.5
    latency = app.read_model.pickup_latency()
    assert latency is not None and latency.jobs == 4


def test_args_search_pages_window_by_window_skipping_nothing(app: skiplock.App,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_reads, "ARGS_WINDOW", 10)
    ids = app.enqueue_many([("noop", {"note": "Needle" if i in (2, 24) else "hay"}) for i in range(30)])
    found, pages, after = [], 0, None
    while True:
        page = app.read_model.find_jobs(JobFilter(args="nEEDLE"), limit=5, after=after)
        pages += 1
        found += [r.id for r in page]
        assert page.searched_from is not None
        if page.cursor is None:
            break
        after = page.cursor
    assert found == [ids[24], ids[2]]
    assert pages == 3  # one window of 10 ids each, not one scan of them all


def test_every_filter_of_the_job_list(app: skiplock.App, backend: MySQLBackend) -> None:
    @app.task(name="boom", queue="mail", max_attempts=1)
    def boom(job: Any, **_: Any) -> None:
        raise KeyError("no such user")

    @app.task(name="fine", queue="mail")
    def fine(job: Any, **_: Any) -> None:
        pass

    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    failed = app.enqueue("boom", {"user": "Ann"})
    done = app.enqueue("fine", {"user": "Bob"})
    other = app.enqueue("fine", {"user": "Cy"}, queue="other")
    app.worker(queues=["mail"], concurrency=1, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    after = datetime.now(timezone.utc) + timedelta(seconds=1)

    def ids(**kw: Any) -> list[int]:
        return [r.id for r in app.read_model.find_jobs(JobFilter(**kw), limit=100).items]

    assert ids() == [other, done, failed]
    assert ids(state="failed") == [failed] and ids(state="done") == [done] and ids(state="queued") == [other]
    assert ids(queue="other") == [other] and ids(task="boom") == [failed]
    assert ids(error_class="KeyError") == [failed] and ids(error_class="ValueError") == []
    assert ids(args="ann") == [failed] and ids(args="BOB") == [done] and ids(args="user") == [other, done, failed]
    assert ids(since=before, until=after) == [other, done, failed] and ids(until=before) == [] and ids(since=after) == []
    assert app.read_model.count_jobs(JobFilter(queue="mail")) == (2, False)
    assert app.read_model.count_jobs(JobFilter(queue="mail"), cap=1) == (1, True)
    (row,) = app.read_model.find_jobs(JobFilter(state="failed")).items
    assert row.task == "boom" and row.last_error and row.last_error.startswith("KeyError") and row.attempts == 1
    assert row.finished_at is not None and row.finished_at.tzinfo is not None
