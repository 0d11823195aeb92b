"""The `flow` flag of a job of a limited queue (migration 17, 0017_flow_hint.sql): the plain claims over
several queues or every queue walk an index without those jobs, so a limited queue's backlog costs
them nothing; and no job is ever left where no claim looks -- a flagged job's queue keeps its
queue_limits row (invariant I1) through a clear, an enqueue still open, a job in flight, a retry."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.backend.postgres.producing import COPY_MIN_JOBS
from skiplock.backend.postgres.queries import with_limit
from skiplock.worker.flow import TASKS_REST_MAX

from pathlib import Path

from support import PLANS, job_scans, nodes, plan, run_cli, wait_for

HERE = Path(__file__).resolve().parent


def flags(db: psycopg.Connection[Any], queue: str) -> list[bool]:
    return [f for (f,) in db.execute("SELECT flow FROM skiplock.jobs WHERE queue = %s ORDER BY id", [queue])]


def rows(db: psycopg.Connection[Any]) -> list[str]:
    return [q for (q,) in db.execute("SELECT queue FROM skiplock.queue_limits ORDER BY queue")]


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("name", ["claim_tasks_any_queue", "claim_tasks_of_queues", "claim_of_queues"])
@pytest.mark.parametrize("backlog", [5_000, 50_000])
def test_a_plain_claim_does_not_walk_a_limited_queues_backlog(app: skiplock.App, dsn: str, backlog: int,
                                                             name: str, mode: str):
    """``backlog`` jobs of a limited queue (enqueued through COPY, flagged) wait ahead of two plain jobs,
    same task: the plain claim over every queue (or over both queues) walks jobs_claim_any_idx, which
    holds only the unflagged, so it reads the same few pages for 5,000 or 50,000 such jobs. (Before the
    flag: one heap row per waiting job, removed by the test of queue_limits.)"""
    app.set_queue_limits("lim", concurrency=5)
    app.enqueue_many([("t", {"n": i}, {"queue": "lim"}) for i in range(backlog)])
    app.enqueue_many([("t", {"n": i}) for i in range(2)])
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FILTER (WHERE flow), count(*) FILTER (WHERE NOT flow) "
                         "FROM skiplock.jobs").fetchone() == (backlog, 2)
        c.execute("VACUUM ANALYZE skiplock.jobs")
    root = plan(dsn, with_limit(app.backend.q[name], 1),
                {"tasks": ["t"], "queues": ["lim", "default"], "limit": 1}, analyze=True, mode=mode, warm=True)
    scans = job_scans(root)
    assert scans[0]["Node Type"] == "Index Scan" and scans[0]["Index Name"] == "jobs_claim_any_idx", \
        json.dumps(root)[:3000]
    assert not [n for n in nodes(root) if n["Node Type"] == "Sort" and job_scans(n)]
    assert scans[0].get("Actual Rows") == 1
    assert scans[0].get("Rows Removed by Filter", 0) == 0, scans[0]
    read = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in scans)
    # the descent and a row (4 blocks measured on a warm session, for 5,000 as for 50,000; before the
    # flag: the limited queue's rows, thousands of blocks)
    assert read <= 8, (backlog, read, json.dumps(root)[:3000])


def test_the_flag_follows_the_queues_limits_on_every_enqueue_path(app: skiplock.App, db: psycopg.Connection[Any]):
    app.enqueue("t", {"n": 0}, queue="q")  # before any limit: no flag
    app.set_queue_limits("q", concurrency=2)  # the waiting job gets it
    assert flags(db, "q") == [True]
    app.enqueue("t", {"n": 1}, queue="q")  # one INSERT
    app.enqueue("t", {"n": 2}, queue="q", unique_key="k2")  # enqueue_unique
    app.enqueue_many([("t", {"n": 3}, {"queue": "q"}), ("t", {"n": 4}, {"queue": "other"})])  # enqueue_many
    app.enqueue_many([("t", {"n": 5}, {"queue": "q", "unique_key": "k5"}),  # enqueue_many_unique
                      ("t", {"n": 6}, {"queue": "other", "unique_key": "k6"})])
    app.enqueue_many([("t", {"n": i}, {"queue": "q" if i % 2 else "other"}) for i in range(COPY_MIN_JOBS)])  # COPY
    assert set(flags(db, "q")) == {True} and len(flags(db, "q")) == 5 + COPY_MIN_JOBS // 2
    assert set(flags(db, "other")) == {False}
    app.set_queue_limits("q", concurrency=3, rate="10/s")  # a change of limits: still flagged
    assert set(flags(db, "q")) == {True}
    app.set_queue_limits("q")  # cleared: nothing in flight, so the flags and the row go at once
    assert set(flags(db, "q")) == {False}
    assert rows(db) == [] and app.queue_limits() == []
    app.enqueue("t", {"n": 7}, queue="q")
    assert set(flags(db, "q")) == {False}


def test_a_cleared_queue_keeps_its_row_while_a_flagged_job_is_in_flight(app: skiplock.App, dsn: str,
                                                                         db: psycopg.Connection[Any]):
    """The flagged job locked by a transaction lease keeps its flag (the clear skips it), so the row
    stays, without limits: hidden from the readers, still the worker's flow claim's queue. Once the
    lease ends (here a rollback: the job is queued again, flagged), the next pass deletes the row."""
    app.set_queue_limits("q", concurrency=2)
    held, other = app.enqueue("t", {"n": 0}, queue="q"), app.enqueue("t", {"n": 1}, queue="q")
    with psycopg.connect(dsn) as lease:
        lease.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", [held])
        app.set_queue_limits("q")
        assert rows(db) == ["q"]  # retiring
        assert app.queue_limits() == [] and app.backend.queue_limits() == []
        assert [r[0] for r in app.backend.queue_limits(retiring=True)] == ["q"]
        assert dict(db.execute("SELECT id, flow FROM skiplock.jobs").fetchall()) == {held: True, other: False}
        assert app.backend.retire_queue_limits() == []  # still in flight
        assert app.clearing_queue_limits() == ["q"]
        shown = run_cli(dsn, "limits", cwd=HERE)
        assert shown.returncode == 0 and "queue q: limits cleared" in shown.stdout, shown.stdout
        assert json.loads(run_cli(dsn, "limits", "--json", cwd=HERE).stdout)["clearing"] == ["q"]
        lease.rollback()
    assert app.backend.retire_queue_limits() == ["q"]
    assert rows(db) == [] and set(flags(db, "q")) == {False}
    assert app.clearing_queue_limits() == []


def test_an_open_enqueue_keeps_the_row_until_it_ends(app: skiplock.App, dsn: str, db: psycopg.Connection[Any]):
    """An enqueue flags its job under a KEY SHARE lock of the queue's row, held to its COMMIT: the
    clear cannot delete the row meanwhile (it waits RETIRE_LOCK_TIMEOUT, then leaves it to a later
    pass), so the job committed later is never flagged in a queue without a row."""
    app.set_queue_limits("q", concurrency=2)
    with psycopg.connect(dsn) as producer:
        job = app.enqueue("t", {"n": 0}, queue="q", conn=producer)
        app.set_queue_limits("q")
        assert rows(db) == ["q"]
        producer.commit()
    assert flags(db, "q") == [True] and db.execute("SELECT id FROM skiplock.jobs").fetchone()[0] == job
    assert app.backend.retire_queue_limits() == ["q"]
    assert rows(db) == [] and flags(db, "q") == [False]


def test_a_job_put_back_after_it_failed_gets_its_queues_flag_anew(app: skiplock.App, db: psycopg.Connection[Any]):
    """A finished job's flag is from its enqueue: put back (`retry_job`, `retry_failed`), it gets the
    flag an enqueue would get now -- none once its queue's limits (and row) are gone, the flag (and the
    row's lock, as an enqueue takes it) if its queue has limits now."""
    app.set_queue_limits("q", concurrency=2)
    job = app.enqueue("t", {"n": 0}, queue="q")
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now() WHERE id = %s", [job])
    db.commit()
    app.set_queue_limits("q")  # a finished job does not hold the row
    assert rows(db) == []
    app.retry_job(job)
    assert flags(db, "q") == [False]
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now() WHERE id = %s", [job])
    db.commit()
    app.set_queue_limits("q", rate="5/s")
    assert flags(db, "q") == [False]  # finished: not flagged by the limit's change
    app.retry_failed("q")
    assert flags(db, "q") == [True]


def test_a_worker_of_every_queue_runs_a_retiring_queues_jobs(app: skiplock.App, dsn: str, db: psycopg.Connection[Any]):
    """While a cleared queue's row stays (a job in flight still flagged), its jobs -- flagged or not --
    are the flow claim's (the plain claims test queue_limits); a worker of every queue runs them all,
    without limits, and the plain claims once the row is gone."""
    ran: list[int] = []

    @app.task("t")
    def t(job: Any, n: int) -> None:
        ran.append(n)

    app.set_queue_limits("q", concurrency=1)
    app.enqueue_many([("t", {"n": i}, {"queue": "q"}) for i in range(10)])
    first = db.execute("SELECT min(id) FROM skiplock.jobs").fetchone()[0]
    with psycopg.connect(dsn) as lease:
        lease.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE", [first])
        app.set_queue_limits("q")
        app.enqueue_many([("t", {"n": i}, {"queue": "q"}) for i in range(10, 15)])
        assert rows(db) == ["q"] and flags(db, "q").count(True) == 1
        worker = app.worker(concurrency=4, poll_interval=0.05, handle_signals=False, adaptive_limit=False)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: len(ran) == 14, timeout=30, what="every job but the one in flight")
            lease.rollback()
            wait_for(lambda: len(ran) == 15, timeout=30, what="the last one, once let go")
        finally:
            worker.stop()
            thread.join(30)
    assert sorted(ran) == list(range(15))
    assert app.backend.retire_queue_limits() == ["q"]
    app.enqueue("t", {"n": 15}, queue="q")
    with app.backend.connect_lease() as lease_session:  # the plain claim over every queue takes it now
        lease_session.begin()
        got = app.backend.claim(lease_session, None, 1, tasks=["t"])
        assert [j.args for j in got] == [{"n": 15}] or [json.loads(j.args) for j in got] == [{"n": 15}]
        lease_session.rollback()


def test_the_limited_queues_claim_goes_first_while_it_finds_the_jobs(app: skiplock.App):
    """A task with limits in a limited queue (the `limits` case of bench/flow.py): its jobs are
    flagged, so the flow claim of the task's limits over every queue finds none of them, and the
    claim of the limited queue takes them. Once that claim has found jobs it goes first, so a drain
    does not pay an empty claim (a BEGIN, the claim, a let-go) before each of its batches. Counted
    on the real backend's `claim_flow_many` (wrapped, still called)."""
    from skiplock.worker.batching import WholeBatches

    ran: list[int] = []

    @app.task("t", queue="q", concurrency=2, partition_by="k")
    def t(job: Any, k: int) -> None:
        ran.append(k)

    app.set_queue_limits("q", concurrency=50)
    jobs = 400
    app.enqueue_many([("t", {"k": i % 100}) for i in range(jobs)])
    calls: list[tuple[Any, int]] = []
    real = app.backend.claim_flow_many

    def counted(lease: Any, limit: int, queues: Any, *args: Any) -> Any:
        got = real(lease, limit, queues, *args)
        calls.append((queues, len(got)))
        return got

    app.backend.claim_flow_many = counted  # type: ignore[method-assign]
    worker = app.worker(concurrency=2, poll_interval=0.05, handle_signals=False, adaptive_limit=False,
                        batch_policy=WholeBatches(batch_size=8))
    thread = threading.Thread(target=worker.run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        wait_for(lambda: len(ran) == jobs, timeout=60, what="every job")
        elapsed = time.monotonic() - started
    finally:
        worker.stop()
        thread.join(30)
    found = [c for c in calls if c[1]]
    empty_before_work = [c for c in calls if not c[1] and c[0] is None]
    assert found and all(queues == ["q"] for queues, _ in found), found[:5]
    # after each empty one, a rest (doubling up to TASKS_REST_MAX) before it goes first again; a few at
    # the start and the end, when nothing is left. With the task limits' claim always first: one per
    # batch, 51 measured (400 jobs in batches of 8)
    assert len(empty_before_work) <= 8 + elapsed / TASKS_REST_MAX, (len(empty_before_work), elapsed, len(found))


def test_a_limited_queues_backlog_does_not_starve_a_limited_tasks_jobs(app: skiplock.App):
    """The claim of the task limits' jobs goes after the limited queues' one only for a short rest
    after it found nothing (worker/flow.py, TASKS_REST_MAX): jobs of a task with `concurrency`
    enqueued while a limited queue's backlog drains start long before that backlog is done."""
    ran: list[tuple[str, int]] = []

    @app.task("bulk_job", queue="bulk")
    def bulk_job(job: Any, n: int) -> None:
        time.sleep(0.01)
        ran.append(("bulk", n))

    @app.task("report", concurrency=2)
    def report(job: Any, n: int) -> None:
        ran.append(("report", n))

    app.set_queue_limits("bulk", concurrency=100)
    app.enqueue_many([("bulk_job", {"n": i}) for i in range(400)])
    worker = app.worker(concurrency=2, poll_interval=0.05, handle_signals=False, adaptive_limit=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(ran) >= 20, timeout=60, what="the backlog's drain under way")
        app.enqueue_many([("report", {"n": i}) for i in range(4)])
        wait_for(lambda: sum(kind == "report" for kind, _ in ran) == 4, timeout=60, what="the reports")
        bulk_before = sum(kind == "bulk" for kind, _ in ran)
        wait_for(lambda: len(ran) == 404, timeout=120, what="every job")
    finally:
        worker.stop()
        thread.join(30)
    # 400 jobs of 10 ms on 2 slots take 2 s or more; the reports wait about TASKS_REST_MAX at most
    assert bulk_before < 300, bulk_before


def test_flagging_a_queue_reads_its_unfinished_jobs_not_the_finished_ones(app: skiplock.App, dsn: str):
    """`flag_queue_jobs` (a queue gets limits) finds the queue's queued jobs in jobs_claim_idx and its
    running and blocked ones in jobs_state_queue_idx -- never a scan of the finished jobs, which a
    table keeps by the million (migration 20 took the queued jobs out of jobs_state_queue_idx; an
    `IN` of the three states proves neither index's predicate)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task, state, finished_at) "
                  "SELECT 'q' || (g % 5), 't', 'done', now() FROM generate_series(1, 50000) g")
        c.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'q' || (g % 5), 't' FROM generate_series(1, 500) g")
        c.execute("VACUUM ANALYZE skiplock.jobs")
    root = plan(dsn, app.backend.q["flag_queue_jobs"], {"queue": "q1"}, analyze=True, mode="force_custom_plan")
    assert not [n for n in nodes(root) if n["Node Type"] == "Seq Scan"], json.dumps(root)[:3000]
    assert {n["Index Name"] for n in nodes(root) if n["Node Type"] == "Bitmap Index Scan"} == \
        {"jobs_claim_idx", "jobs_state_queue_idx"}, json.dumps(root)[:3000]
    assert root["Plans"][-1]["Actual Rows"] == 100  # the queue's 100 queued jobs, flagged
