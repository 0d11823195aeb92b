"""A claim's plan does not depend on fresh statistics (migration 20, 0020_state_queue_not_queued.sql).

The table is analyzed while it holds finished jobs only (a queue drained, then autovacuum came), so
the statistics say no job is queued; then a backlog arrives and nothing analyzes it again -- what a
server with the default autovacuum_naptime (a minute) shows for up to that long after a burst. Every
plain claim must still walk its claim index in claim order and read a few pages, in the plan a
prepared claim keeps (generic) as in one made for the values (custom). Before migration 20 the
claims of one queue and of every queue read the whole backlog by (state, queue) and sorted it:
26-148 ms per claim at 100,000 jobs."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.backend.postgres.queries import claim_of_queues, with_limit

from support import PLANS, flow_claim_params, job_scans, nodes, plan

BACKLOG = 30_000


@pytest.fixture
def stale(app: skiplock.App, dsn: str) -> str:
    """Statistics of 20,000 finished jobs; then BACKLOG queued ones in three queues, not analyzed (nor
    by autovacuum meanwhile: it is off for this test's table)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER TABLE skiplock.jobs SET (autovacuum_enabled = false)")
        c.execute("INSERT INTO skiplock.jobs (queue, task, state, finished_at) "
                  "SELECT 'q0', 't', 'done', now() FROM generate_series(1, 20000)")
        c.execute("VACUUM ANALYZE skiplock.jobs")
        c.execute("INSERT INTO skiplock.jobs (queue, task, priority) "
                  "SELECT 'q' || (g %% 3), 't', g %% 2 FROM generate_series(1, %s) g", [BACKLOG])
        queued = c.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'queued'").fetchone()[0]
        stats = c.execute("SELECT most_common_vals::text FROM pg_stats "
                          "WHERE schemaname = 'skiplock' AND tablename = 'jobs' AND attname = 'state'").fetchone()[0]
    assert queued == BACKLOG and stats == "{done}"  # the situation under test: stale, and known to be
    return dsn


def claims(app: skiplock.App) -> list[tuple[str, str, dict[str, Any], str]]:
    """(label, statement, values, the claim index it must walk) for every plain claim a worker sends."""
    q = app.backend.q
    out = []
    for prefix in ("claim", "claim_tasks"):
        for queues, index in ((["q1"], "jobs_claim_idx"), (["q1", "q2"], "jobs_claim_idx"),
                              ([f"q{i}" for i in range(20)], "jobs_claim_any_idx")):
            text, values = claim_of_queues(q, prefix, queues)
            out.append((f"{prefix} of {len(queues)} queue(s)", text, values, index))
        out.append((f"{prefix} of every queue", q[f"{prefix}_any_queue"], {}, "jobs_claim_any_idx"))
    return out


@pytest.mark.parametrize("mode", PLANS)
def test_every_plain_claim_walks_its_claim_index_on_stale_statistics(app: skiplock.App, stale: str, mode: str):
    for label, text, values, index in claims(app):
        root = plan(stale, with_limit(text, 32), {**values, "tasks": ["t"], "limit": 32}, analyze=True, mode=mode,
                    warm=True)
        scans = job_scans(root)
        shown = f"{label}: {json.dumps(root)[:3000]}"
        walks = [s for s in scans if s["Node Type"] != "Tid Scan"]  # (a merged claim's rows, fetched again by ctid)
        assert walks and {s["Node Type"] for s in walks} == {"Index Scan"}, shown
        assert {s["Index Name"] for s in walks} == {index}, shown
        assert not [n for n in nodes(root) if n["Node Type"] == "Sort"], shown
        assert sum(s.get("Actual Rows", 0) for s in walks) <= 64, shown  # the claim's rows, not the backlog
        read = sum(s.get("Shared Hit Blocks", 0) + s.get("Shared Read Blocks", 0) for s in scans)
        assert read <= 60, (label, read, shown)


@pytest.mark.parametrize("mode", PLANS)
def test_the_flow_claims_walk_the_claim_index_on_stale_statistics(app: skiplock.App, stale: str, mode: str):
    """The flow claims of a worker of one queue and of every queue (as the worker sends them: the
    limit a literal), on the same statistics."""
    for name, values in (("claim_flow_of_queue", {"queue": "q1", "queues": None}),
                         ("claim_flow", {"queue": None, "queues": None})):
        root = plan(stale, with_limit(app.backend.q[name], 32), flow_claim_params(**values), analyze=True, mode=mode,
                    warm=True)
        scans = job_scans(root)
        shown = f"{name}: {json.dumps(root)[:3000]}"
        assert scans and scans[0]["Node Type"] == "Index Scan", shown
        assert scans[0]["Index Name"] in ("jobs_claim_idx", "jobs_claim_any_idx"), shown
        assert not [n for n in nodes(root) if n["Node Type"] == "Sort" and job_scans(n)], shown
        assert scans[0].get("Actual Rows", 0) <= 64, shown
