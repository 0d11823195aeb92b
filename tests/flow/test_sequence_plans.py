"""Sequences cost the same whatever waits (docs/flow-control.md, "Sequences"; migration 15): a job
waiting behind its sequence's head is 'blocked', in no claim index, so the claim's reads do not grow
with the blocked backlog or the number of sequences; and a head's finishing write, whose trigger
promotes the next job, is one descent of jobs_sequence_blocked_idx. Measured as the blocks the
statement (its trigger included) fetched from the jobs table and its indexes -- the server's
per-transaction counters -- with 5,000 and 50,000 blocked jobs (over 1,000 and 10,000 sequences),
and no sequential scan of the jobs."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import skiplock

COUNTERS = """
SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid))::int,
       (SELECT pg_stat_get_xact_numscans(%(jobs)s::regclass))::int
  FROM pg_class c
 WHERE c.oid = %(jobs)s::regclass
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %(jobs)s::regclass)"""


def measured(c: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> tuple[int, int, list[Any]]:
    """(blocks fetched, sequential scans of jobs, rows) of one statement, in the open transaction."""
    before = c.execute(COUNTERS, {"jobs": "skiplock.jobs"}).fetchone()
    rows = c.execute(query, params).fetchall()
    after = c.execute(COUNTERS, {"jobs": "skiplock.jobs"}).fetchone()
    return after[0] - before[0], after[1] - before[1], rows


def costs(app: skiplock.App, dsn: str, key: str) -> tuple[int, int]:
    """(blocks of the claim, blocks of the head's finishing write) for a new sequence ``key`` of two jobs."""
    head = app.enqueue("t", {}, queue="q", sequence=key)
    follower = app.enqueue("t", {}, queue="q", sequence=key)
    with psycopg.connect(dsn) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        claim, seq_scans, rows = measured(c, app.backend.q["claim_tasks"], {"queue": "q", "tasks": ["t"], "limit": 1})
        assert [r[0] for r in rows] == [head] and seq_scans == 0
        done, seq_scans, _ = measured(c, "UPDATE skiplock.jobs SET state = 'done', finished_at = now() "
                                         "WHERE id = %(id)s RETURNING id", {"id": head})
        assert seq_scans == 0
        assert c.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [follower]).fetchone()[0] == "queued"
        c.rollback()
    app.cancel_job(follower)
    app.cancel_job(head)
    return claim, done


def blocked(dsn: str, jobs: int, sequences: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO skiplock.jobs (queue, task, sequence, sequence_on_failure, state) "
                  "SELECT 'q', 't', 's' || (g %% %s), 'wait', 'blocked' FROM generate_series(1, %s) g",
                  [sequences, jobs])
        c.execute("ANALYZE skiplock.jobs")


def test_blocked_jobs_cost_neither_the_claim_nor_the_promotion(app: skiplock.App, dsn: str) -> None:
    blocked(dsn, 5000, 1000)
    small = costs(app, dsn, "a")
    blocked(dsn, 45000, 10000)  # 50,000 blocked over 10,000 sequences
    large = costs(app, dsn, "b")
    # the claim: the claim index's path to the one queued job and its row; the finishing write: the
    # head's row and index entries, the sequence's row, one descent to the next blocked job and its
    # row and entries -- a B-tree a level deeper at most, never a scan of the blocked backlog (which
    # is 10 times larger the second time)
    assert small[0] <= 20 and small[1] <= 80, small
    assert large[0] <= small[0] + 4 and large[1] <= small[1] + 8, (small, large)
