"""jobs_finished_idx is keyed by (state, finished_at) (migration 22): the dashboard's windows over the
jobs finished lately read one range of it per finished state -- on PostgreSQL 15 as on 18 (test_pg15_
finished_index.py), where a range on its second column alone would read the whole index -- and a
prune reads one state's range (test_pruner.py)."""

from __future__ import annotations

import json

import pytest

from support import nodes, plan


def finished_over_two_days(db, n: int) -> None:
    """``n`` finished jobs, the three states in turn, one every 2 * 86400 / n seconds back from now."""
    db.execute("INSERT INTO skiplock.jobs (task, state, attempts, run_at, started_at, finished_at) "
               "SELECT 't', (ARRAY['done', 'failed', 'cancelled'])[1 + g %% 3], 1, now() - s, now() - s, now() - s "
               "  FROM generate_series(1, %s) g, LATERAL (SELECT g * (2 * 86400.0 / %s) * interval '1 second' AS s) x",
               [n, n])
    db.execute("VACUUM ANALYZE skiplock.jobs")


@pytest.mark.parametrize("name", ["dash_throughput", "dash_pickup_latency"])
def test_the_last_hours_window_reads_that_hours_jobs_only(app, db, dsn, name):
    finished_over_two_days(db, 48_000)  # 1,000 an hour
    root = plan(dsn, app.backend.q[name], {"seconds": 3600}, analyze=True, mode="force_custom_plan")
    scans = [n for n in nodes(root) if n.get("Relation Name") == "jobs" or n.get("Index Name")]
    shown = json.dumps(root)[:3000]
    assert scans and all(n.get("Index Name") == "jobs_finished_idx" for n in scans if "Index Name" in n), shown
    assert not [n for n in nodes(root) if n["Node Type"] == "Seq Scan"], shown
    index_scans = [n for n in scans if "Index Name" in n]
    assert len(index_scans) == 3, shown  # one range per state
    assert sum(n["Actual Rows"] for n in index_scans) in range(990, 1011), shown  # the hour's jobs
    read = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in index_scans)
    assert read <= 60, (read, shown)
