"""The claim over a few named queues (``claim_of_queues_merged`` in queries.sql): each queue's own
walk of jobs_claim_idx, merged in claim order, so another queue's backlog -- or a paused queue's,
or a limited one's -- costs it nothing (buffers read by one claim, EXPLAIN ANALYZE at two backlog
sizes: 5,000 and 50,000). Before, it walked jobs_claim_any_idx and read one heap row per job of the
other queue ahead (10-13 ms a claim behind 50,000). Over more than ``MERGED_QUEUES_MAX`` queues the
claim still walks jobs_claim_any_idx (``claim_of_queues``), and still claims correctly."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.backend.postgres.queries import MERGED_QUEUES_MAX, claim_of_queues, load_queries, with_limit

from support import PLANS, job_scans, nodes, plan


def _backlog_ahead(dsn: str, n: int) -> None:
    """``n`` jobs of queue "held" (the lower ids: ahead of everything in claim order), then 300 jobs
    in each of "a" and "b", interleaved; statistics fresh. (With two jobs each, the statistics of a
    50,000-row sample sometimes estimated "a" and "b" at a row or two, and the server then fetched
    those few rows with a bitmap scan and sorted them: right for two rows, not what this tests.)"""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'held', 't' FROM generate_series(1, %s)", [n])
        c.execute("INSERT INTO skiplock.jobs (queue, task)"
                  "  SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 't' FROM generate_series(1, 600) g")
        c.execute("VACUUM ANALYZE skiplock.jobs")


def _claim_plan(app: skiplock.App, dsn: str, prefix: str, queues: list[str], limit: int,
                mode: str) -> tuple[dict[str, Any], str]:
    """The merged claim of ``queues`` for task "t", as the worker sends it, run under ``mode``
    (EXPLAIN ANALYZE, warm): its plan, and the plan's text for a failure's message."""
    text, values = claim_of_queues(app.backend.q, prefix, queues)
    values.update(limit=limit, tasks=["t"])
    root = plan(dsn, with_limit(text, limit), values, analyze=True, mode=mode, warm=True)
    return root, json.dumps(root)[:4000]


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("prefix", ["claim", "claim_tasks"])
@pytest.mark.parametrize("held", ["not named", "paused", "limited"])
@pytest.mark.parametrize("backlog", [5000, 50000])
def test_a_claim_of_named_queues_never_walks_another_queues_backlog(app: skiplock.App, dsn: str, backlog: int,
                                                                   held: str, prefix: str, mode: str):
    """The queue "held" is not among those claimed, or is named but paused, or is named but limited
    (its jobs are the flow claim's): its backlog ahead costs the claim nothing. Each named queue's
    walk starts at that queue's first entry of jobs_claim_idx; a paused or limited queue's walk is
    not run at all (its tests run once per claim)."""
    if held == "limited":
        app.set_queue_limits("held", concurrency=5)  # (set first: the backlog is then flagged as enqueued)
    _backlog_ahead(dsn, backlog)
    if held == "paused":
        app.pause_queue("held")
    queues = ["a", "b"] if held == "not named" else ["held", "a", "b"]
    root, where = _claim_plan(app, dsn, prefix, queues, 2, mode)
    assert root.get("Actual Rows") == 2, where
    assert [n for n in nodes(root) if n["Node Type"] == "Merge Append"], where
    assert not [n for n in nodes(root) if n["Node Type"] == "Sort"], where
    scans = job_scans(root)
    # the walks (jobs_claim_idx) and each row merged read again by its address to be locked
    assert {n.get("Index Name") for n in scans} <= {"jobs_claim_idx", None}, where
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Tid Scan") for n in scans), where
    walked = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in scans if n.get("Index Name") == "jobs_claim_idx")
    assert walked <= 4, where  # a and b's first rows, read as far as the merge takes them; none of held's
    read = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in scans)
    # a descent per queue walked and two rows read again to be locked: the same few pages for a
    # backlog of 5,000 or 50,000 (before: thousands)
    assert read <= 24, (backlog, read, where)


def test_a_queue_named_twice_is_walked_once():
    q = load_queries("skiplock")
    text, values = claim_of_queues(q, "claim_tasks", ["a", "b", "a"])
    assert values == {"queue_0": "a", "queue_1": "b"}
    assert text.count("UNION ALL") == 1 and "%(queue)s" not in text
    assert with_limit(text, 32).count("LIMIT 32") == 1  # the claim's one LIMIT: the walks have none
    assert claim_of_queues(q, "claim_tasks", ["a", "a"]) == (q["claim_tasks"], {"queue": "a"})  # one queue's claim


def test_over_many_queues_the_claim_walks_the_index_of_every_queue():
    q = load_queries("skiplock")
    many = [f"q{i}" for i in range(MERGED_QUEUES_MAX + 1)]
    assert claim_of_queues(q, "claim", many) == (q["claim_of_queues"], {"queues": many})
    text, values = claim_of_queues(q, "claim", many[:MERGED_QUEUES_MAX])
    assert text.count("UNION ALL") == MERGED_QUEUES_MAX - 1 and len(values) == MERGED_QUEUES_MAX


@pytest.mark.parametrize("count", [2, MERGED_QUEUES_MAX, MERGED_QUEUES_MAX + 1])
def test_a_claim_of_named_queues_takes_their_jobs_in_claim_order_whatever_their_number(app: skiplock.App,
                                                                                      count: int):
    """The merged walks and the walk of every queue's index (more than MERGED_QUEUES_MAX queues)
    claim the same jobs in the same order: the named queues' only, (priority, run_at, id)."""
    queues = [f"q{i}" for i in range(count)]
    ids: dict[int, Any] = {}
    for i, queue in enumerate(queues * 2):
        ids[app.enqueue("t", {"n": i}, queue=queue, priority=i % 3)] = (i % 3, queue)
    app.enqueue("t", {}, queue="elsewhere", priority=-5)
    backend = app.backend
    lease = backend.connect_lease("skiplock-test")
    try:
        lease.begin()
        got = backend.claim(lease, queues, limit=4 * count, tasks=["t"])
        assert [j.id for j in got] == sorted(ids, key=lambda k: (ids[k][0], k))
        lease.rollback()
    finally:
        lease.close()


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("prefix", ["claim", "claim_tasks"])
def test_each_walk_stays_an_index_walk_when_its_queues_pages_are_not_all_visible(app: skiplock.App, dsn: str,
                                                                                prefix: str, mode: str):
    """Each walk is planned for a part of its rows (its LIMIT is a sub-select, which the planner does
    not read: it assumes a tenth), so a queue whose pages are not all-visible -- a busy queue's are
    not -- is still walked in index order as far as the merge takes it, never read whole and sorted.
    Planned for all its rows, a queue of 3,000 jobs, a third of the table's rows updated since its
    last VACUUM, was read with a bitmap scan and sorted at every claim."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'other', 't' FROM generate_series(1, 50000)")
        c.execute("INSERT INTO skiplock.jobs (queue, task) SELECT 'a', 't' FROM generate_series(1, 3000)")
        c.execute("VACUUM ANALYZE skiplock.jobs")
        c.execute("UPDATE skiplock.jobs SET attempts = attempts WHERE id % 3 = 0")
        c.execute("ANALYZE skiplock.jobs")
    root, where = _claim_plan(app, dsn, prefix, ["a", "other"], 2, mode)
    assert root.get("Actual Rows") == 2, where
    assert [n for n in nodes(root) if n["Node Type"] == "Merge Append"], where
    assert not [n for n in nodes(root) if n["Node Type"] in ("Sort", "Bitmap Heap Scan", "Seq Scan")], where
    walked = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in job_scans(root)
                 if n.get("Index Name") == "jobs_claim_idx")
    assert walked <= 4, where


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("waiting", [5000, 50000])
def test_a_claim_of_named_queues_does_not_read_their_jobs_not_yet_due(app: skiplock.App, dsn: str, waiting: int,
                                                                      mode: str):
    """``waiting`` jobs of a named queue due in an hour, ahead in id order: each walk tests run_at on
    the index entry, as the claim of one queue does (tests/integration/test_claim_due_first.py)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task, run_at) SELECT 'a', 't', now() + interval '1 hour'"
                  "  FROM generate_series(1, %s)", [waiting])
        c.execute("INSERT INTO skiplock.jobs (queue, task) SELECT q, 't' FROM unnest(ARRAY['a', 'b']) q")
        c.execute("VACUUM ANALYZE skiplock.jobs")
    root, where = _claim_plan(app, dsn, "claim_tasks", ["a", "b"], 2, mode)
    assert root.get("Actual Rows") == 2, where
    scans = job_scans(root)
    assert not [n for n in scans if n.get("Rows Removed by Filter")], where
    read = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in scans)
    assert read <= 24, (waiting, read, where)


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("prefix", ["claim", "claim_tasks"])
def test_each_row_is_locked_as_the_merge_yields_it_among_many_finished_jobs(app: skiplock.App, dsn: str,
                                                                           prefix: str, mode: str):
    """The lock is taken in a LATERAL subquery, one row at a time as the merge yields it, the row
    read by its address (a Tid Scan): a nested loop whatever the statistics. A join of the merge to the table with FOR UPDATE on the outer query
    was planned as a hash join over every row of the table and a sort once finished jobs filled it
    (20,000 done, 2,000 queued: measured, and 9 ms per claim of 32 in a drain, against 0.4)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task, state, finished_at)"
                  "  SELECT 'a', 't', 'done', now() FROM generate_series(1, 20000)")
        c.execute("INSERT INTO skiplock.jobs (queue, task)"
                  "  SELECT CASE WHEN g % 4 = 0 THEN 'b' ELSE 'a' END, 't' FROM generate_series(1, 2000) g")
        c.execute("ANALYZE skiplock.jobs")
    root, where = _claim_plan(app, dsn, prefix, ["a", "b"], 32, mode)
    assert root.get("Actual Rows") == 32, where
    kinds = [n["Node Type"] for n in nodes(root)]
    assert "Nested Loop" in kinds and "Merge Append" in kinds, where
    assert not {"Hash Join", "Merge Join", "Sort", "Seq Scan", "Bitmap Heap Scan"} & set(kinds), where
    locks = [n for n in nodes(root) if n["Node Type"] == "LockRows"]
    assert len(locks) == 1 and locks[0].get("Actual Loops") == 32, where  # one row locked per row merged
    assert [n["Node Type"] for n in locks[0]["Plans"]] == ["Tid Scan"], where
