"""Jobs not yet due cost a claim nothing (migration 18, docs/guarantees.md "The claim"): the claim order
is (priority, run_at, id) and run_at is a key of the claim indexes, so thousands of jobs scheduled
ahead, or waiting out a retry's backoff with their old (low) ids, neither are read nor delay the
claim of a due job behind them. Measured with EXPLAIN ANALYZE of each plain claim statement, as a
prepared statement runs it (generic and custom plans), at two backlogs: 5,000 and 50,000 such jobs.
Before migration 18 each claim read every one of them from the heap and dropped it (``Rows Removed by
Filter``: the whole backlog; 3.6-5.5 ms per claim behind 20,000)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.backend.postgres.queries import with_limit

from support import PLANS, job_scans, nodes, plan

CLAIMS = ["claim", "claim_tasks", "claim_of_queues", "claim_any_queue", "claim_tasks_of_queues",
          "claim_tasks_any_queue"]
VALUES = {"queue": "default", "queues": ["default", "other"], "tasks": ["t"], "limit": 1}


def wait_ahead(dsn: str, n: int, due: int) -> None:
    """``n`` jobs due in an hour (the lower ids: ahead of everything in id order), then ``due`` jobs
    due now; statistics fresh."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (task, run_at) SELECT 't', now() + interval '1 hour'"
                  "  FROM generate_series(1, %s)", [n])
        c.execute("INSERT INTO skiplock.jobs (task) SELECT 't' FROM generate_series(1, %s)", [due])
        c.execute("VACUUM ANALYZE skiplock.jobs")


def claim_scan(app: skiplock.App, dsn: str, name: str, mode: str) -> tuple[dict[str, Any], int, str]:
    """The claim's one scan of the jobs table (an index scan in claim order, no sort), the buffers it
    read, and the plan (for a failure's message)."""
    root = plan(dsn, with_limit(app.backend.q[name], 1), VALUES, analyze=True, mode=mode, warm=True)
    scans = job_scans(root)
    text = json.dumps(root)[:3000]
    assert len(scans) == 1 and scans[0]["Node Type"] == "Index Scan", text
    assert scans[0]["Index Name"] == ("jobs_claim_idx" if name in ("claim", "claim_tasks") else "jobs_claim_any_idx"), text
    assert not [n for n in nodes(root) if n["Node Type"] == "Sort" and job_scans(n)], text
    assert "run_at" in scans[0].get("Index Cond", ""), text  # tested on the index entry, not the row
    return scans[0], scans[0].get("Shared Hit Blocks", 0) + scans[0].get("Shared Read Blocks", 0), text


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("name", CLAIMS)
@pytest.mark.parametrize("waiting", [5_000, 50_000])
def test_a_claim_does_not_read_the_jobs_not_yet_due_ahead_of_it(app: skiplock.App, dsn: str, waiting: int,
                                                                name: str, mode: str):
    wait_ahead(dsn, waiting, due=2)
    scan, read, text = claim_scan(app, dsn, name, mode)
    assert scan.get("Actual Rows") == 1, text
    assert scan.get("Rows Removed by Filter", 0) == 0, text
    # the descent and a row: 4-5 blocks measured, for 5,000 as for 50,000 (before: ~400 per 20,000)
    assert read <= 8, (waiting, read, text)


@pytest.mark.parametrize("mode", PLANS)
@pytest.mark.parametrize("name", CLAIMS)
def test_a_claim_that_finds_nothing_due_reads_no_row_of_the_jobs_waiting(app: skiplock.App, dsn: str,
                                                                        name: str, mode: str):
    """Nothing due, 20,000 jobs waiting for their time: the empty claim reads none of their rows. On
    PostgreSQL 18 it skips them on the index too (skip scan over priority: one descent more per
    priority); an older server reads their index entries, never their rows."""
    wait_ahead(dsn, 20_000, due=0)
    scan, read, text = claim_scan(app, dsn, name, mode)
    assert scan.get("Actual Rows") == 0, text
    assert scan.get("Rows Removed by Filter", 0) == 0, text
    with psycopg.connect(dsn) as c:
        skips = c.info.server_version >= 180000
    if skips:
        assert read <= 8, (read, text)  # 4 measured
    else:
        assert read < 200, (read, text)  # the index entries only (~120 pages); the rows are ~700

