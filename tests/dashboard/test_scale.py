"""The dashboard at scale: its per-queue figures and its args search read a bounded number of rows,
whatever the table's size (bench/dashboard.py measures them at 1,000,000 jobs). The bounds are
checked on the server's own plan (EXPLAIN ANALYZE: rows each scan of the jobs table examined), not by
timing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from skiplock import job_reads, readmodel
from skiplock.backend.postgres.queries import load_queries
from skiplock.readmodel import JobFilter

from dashboard_support import VIEWER, client

Q = load_queries("skiplock")


def insert(db, n: int, *, queue: str = "default", state: str = "queued", args: str = '{"k": 1}',
           run_at: str = "now() - interval '1 minute'", priority: int = 0) -> None:
    """``n`` jobs in one statement (the fixtures' App would take a round trip each)."""
    finished = "now()" if state in ("done", "failed", "cancelled") else "NULL"
    db.execute(f"INSERT INTO skiplock.jobs (queue, task, state, args, run_at, priority, finished_at)"
               f" SELECT %s, 'noop', %s, %s::jsonb, {run_at}, %s, {finished} FROM generate_series(1, %s)",
               [queue, state, args, priority, n])


def rows_examined(db, name: str, params: dict) -> int:
    """How many rows of skiplock.jobs the statement ``name`` read: every scan node on the table, its
    rows returned plus those its filter removed, times its loops."""
    plan = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q[name], params).fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def walk(node: dict) -> int:
        own = 0
        if node.get("Relation Name") == "jobs":
            own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
        return int(own) + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan[0]["Plan"])


def test_queue_summary_exact_up_to_the_cap_then_estimated(app, db):
    insert(db, 7, queue="a")                                                 # due
    insert(db, 2, queue="a", run_at="now() + interval '1 hour'")            # not yet due
    insert(db, 1, queue="a", priority=-1, run_at="now() - interval '1 second'")  # claimed first
    insert(db, 3, queue="b", state="failed")
    insert(db, 1, queue="b", state="done")
    app.pause_queue("c", force=True)
    by_queue = {q.queue: q for q in app.read_model.queue_summary(cap=5)}
    assert sorted(by_queue) == ["a", "b", "c"]
    a, b, c = by_queue["a"], by_queue["b"], by_queue["c"]
    # above the cap: "more than 5", estimated (a table this small is sampled whole: the exact figure)
    assert a.counts["queued"] == readmodel.BoundedCount(5, False, 10) and str(a.counts["queued"]) == "≈ 10"
    assert a.ready.exact is False and a.ready.n == 5
    # the head is the job claimed next (priority -1), not the one due longest
    assert a.head_age is not None and a.head_age < timedelta(seconds=30) and not a.paused
    assert b.counts["failed"] == readmodel.BoundedCount(3) and b.counts["done"] == readmodel.BoundedCount(1)
    assert b.counts["queued"] == readmodel.BoundedCount(0) and b.head_age is None
    assert c.paused and all(n == readmodel.BoundedCount(0) for n in c.counts.values())
    # under a large cap every figure is exact and agrees with the exact (full-scan) counts
    exact = {(q.queue, s): n.n for q in app.read_model.queue_summary(cap=1000) for s, n in q.counts.items() if n.n}
    assert exact == {(x.queue, x.state): x.count for x in app.read_model.counts()}


def test_summary_statements_read_a_bounded_number_of_rows(db):
    insert(db, 6000, queue="a")
    insert(db, 6000, queue="b", state="done")
    insert(db, 3000, queue="b", state="failed")
    db.execute("VACUUM ANALYZE skiplock.jobs")
    cap = 10
    # 5 states x 2 queues: a probe each for the pairs, then at most cap + 1 entries per pair
    assert rows_examined(db, "dash_state_counts", {"cap": cap}) <= 3 * (cap + 2) + 20
    assert rows_examined(db, "dash_queue_heads", {"cap": cap}) <= 2 * (cap + 2) + 20
    # the exact statements read every row: the reason the dashboard does not use them
    assert rows_examined(db, "counts", {}) >= 15_000


def test_args_search_reads_one_window_of_ids(db):
    insert(db, 15_000, queue="a", state="done")
    db.execute("ANALYZE skiplock.jobs")
    top = db.execute("SELECT max(id) + 1 FROM skiplock.jobs").fetchone()[0]
    params = {k: None for k in ("state", "queue", "task", "error_class", "since", "until", "before")}
    params.update(args="needle", limit=50, id_floor=top - 1000)
    assert rows_examined(db, "dash_find_jobs", params) <= 1000 + 1


def test_args_search_pages_window_by_window_skipping_nothing(app, db, monkeypatch):
    monkeypatch.setattr(job_reads, "ARGS_WINDOW", 10)
    ids = app.enqueue_many([("noop", {"note": "needle" if i in (2, 24) else "hay"}) for i in range(30)])
    found, pages, after = [], 0, None
    while True:
        page = app.read_model.find_jobs(JobFilter(args="NEEDLE"), limit=5, after=after)
        pages += 1
        found += [r.id for r in page]
        assert page.searched_from is not None
        if page.cursor is None:
            break
        after = page.cursor
    assert found == [ids[24], ids[2]]
    assert pages == 3  # one window of 10 ids each, not one scan of them all


def test_overview_queues_and_api_show_an_estimate_above_the_cap(dash, db):
    insert(db, 1200, queue="bulk", state="done")
    insert(db, 3, queue="bulk")
    with client(dash, VIEWER) as c:
        overview = c.get("/", headers={"Accept": "text/html"}).text
        assert "≈ 1,200" in overview and "estimated from a sample" in overview
        doc = c.get("/api/overview").json()
        (bulk,) = doc["queues"]
        assert bulk["counts"]["done"] == {"n": 1000, "exact": False, "estimate": 1200}
        assert bulk["counts"]["queued"] == {"n": 3, "exact": True, "estimate": None}
        assert bulk["ready"]["n"] == 3 and bulk["head_age_seconds"] >= 59
        assert {"queue": "bulk", "state": "queued", "count": 3} in doc["counts"]
        queues = c.get("/queues", headers={"Accept": "text/html"}).text
        assert ">bulk</a></td><td>3</td>" in queues


def test_args_search_page_offers_the_older_window(viewer, app, monkeypatch):
    monkeypatch.setattr(job_reads, "ARGS_WINDOW", 5)
    first = app.enqueue("noop", {"note": "needle"})
    app.enqueue_many([("noop", {"note": "hay"})] * 9)
    page = viewer.get("/jobs?args=needle", headers={"Accept": "text/html"}).text
    assert "No job matches." in page and "Search older jobs" in page
    older = viewer.get("/jobs?args=needle&after=" + json.dumps(["jobs", first + 5]),
                       headers={"Accept": "text/html"}).text
    assert f'/jobs/{first}"' in older and "Search older jobs" not in older


@pytest.mark.parametrize("settle", ["VACUUM ANALYZE", "ANALYZE"])
@pytest.mark.parametrize("name", ["dash_state_counts", "dash_queue_heads"])
def test_summary_statements_never_scan_the_whole_table(app, db, name, settle):
    """A guard on the plan's shape too: no sequential scan of jobs (with a LIMIT it may still read
    the whole table when the rows it wants are at the end), whether or not a vacuum has set the
    visibility map (without it the planner found such a scan of a fresh table cheaper: a CI flake)."""
    insert(db, 5000, queue="a", state="done")
    insert(db, 50, queue="a")
    db.execute(settle + " skiplock.jobs")
    with db.transaction():
        app.backend.summary_preamble(db)  # what the summary's own transaction sends first
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + Q[name], {"cap": 1000}))
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_state_queue_idx" in plan or "jobs_claim_idx" in plan, plan


def test_overview_shows_the_queue_latency_of_the_last_hour(viewer, db):
    for wait in (1, 2, 3):  # due, then started `wait` seconds later, then finished
        db.execute("INSERT INTO skiplock.jobs (task, state, run_at, started_at, finished_at)"
                   " VALUES ('noop', 'done', now() - interval '10 s', now() - interval '10 s' + %s * interval '1 s',"
                   "         now())", [wait])
    db.execute("INSERT INTO skiplock.jobs (task, state, run_at, started_at, finished_at) VALUES"
               " ('noop', 'done', now() - interval '3 h', now() - interval '1 h' - interval '50 min', now() - interval '2 h')")
    html = viewer.get("/", headers={"Accept": "text/html"}).text
    assert "3 jobs:\nmedian 2.0 s · p95 2.9 s · worst 3.0 s" in html  # the job finished 2 h ago is not counted
    job = db.execute("SELECT max(id) FROM skiplock.jobs WHERE finished_at > now() - interval '1 min'").fetchone()[0]
    assert 'id="last-attempt">' in viewer.get(f"/jobs/{job}", headers={"Accept": "text/html"}).text


def test_error_class_expression_means_what_the_regular_expression_did(db):
    """failure_classes, dash_find_jobs and dash_matching_ids compute a job's error class without a
    regular expression (which cost most of the overview's time); it must classify exactly as
    ``coalesce(substring(e FROM '^([^:\\n]{1,200}):'), 'other')`` did."""
    samples = [None, "", "ValueError: bad", "gave up", "gave up: after 5", ":leading colon", "a:b:c",
               "TimeoutError\nsecond: line", "multi\nline", "x" * 200 + ": long", "x" * 201 + ": too long",
               "Ünïcode Error: é", "no colon at all", "tab\there: x", "trailing:"]
    new = Q["failure_classes"].split("SELECT queue, ", 1)[1].split(" AS error_class", 1)[0]
    rows = db.execute(
        f"SELECT e, coalesce(substring(e FROM '^([^:\\n]{{1,200}}):'), 'other'), {new.replace('last_error', 'e')}"
        " FROM unnest(%s::text[]) AS e", [samples]).fetchall()
    assert [r[1] for r in rows] == [r[2] for r in rows], rows
    for name in ("dash_find_jobs", "dash_matching_ids"):
        assert new.replace("last_error", "j.last_error") in Q[name]


def test_the_job_page_shows_how_long_each_failed_attempt_ran(viewer, app):
    import re
    import time as _time

    @app.task(name="slow_fail", max_attempts=2, retry=0.01)
    def slow_fail(job):
        _time.sleep(0.05)
        raise ValueError(f"attempt {job.attempt}")

    job_id = app.enqueue("slow_fail", {})
    from support import wait_for

    def failed() -> bool:
        app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
        return app.get_job(job_id).state == "failed"

    wait_for(failed, 30, "both attempts to fail", interval=0.02)
    html = viewer.get(f"/jobs/{job_id}", headers={"Accept": "text/html"}).text
    ran = [int(ms) for ms in re.findall(r'class="ran">ran (\d+) ms<', html)]
    assert len(ran) == 2 and all(ms >= 50 for ms in ran), html  # each slept 50 ms before failing
