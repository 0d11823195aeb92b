"""The background pruner paces its deletes (issue 16, goal 4): at most half the jobs table's
autovacuum threshold per pass, passes back to back while there is work, and everything past its
retention deleted in the end. Real PostgreSQL; passes are awaited with Service.wait_for_passes, never
timed."""

from __future__ import annotations

import math

from skiplock.maintenance.pruner import Pruner

from support import nodes, plan

INTERVAL = 3600.0  # the normal interval: only the pruner's catch-up passes can finish within the test


def insert_finished(db, state: str, n: int, age: str) -> None:
    db.execute("INSERT INTO skiplock.jobs (task, state, attempts, started_at, finished_at) "
               "SELECT 't', %s, 1, now() - %s::interval, now() - %s::interval FROM generate_series(1, %s)",
               [state, age, age, n])


def reloption(db, name: str) -> str | None:
    row = db.execute("SELECT option_value FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, "
                     "pg_options_to_table(c.reloptions) WHERE n.nspname = 'skiplock' AND c.relname = 'jobs' "
                     "AND option_name = %s", [name]).fetchone()
    return row[0] if row else None


def kept_rows(db) -> list[tuple[str, int]]:
    return db.execute("SELECT state, count(*)::int FROM skiplock.jobs GROUP BY state ORDER BY state").fetchall()


def run_pruner(app, passes: int, **kw) -> Pruner:
    pruner = Pruner(app, INTERVAL, **kw).start()
    try:
        # On a pruner that deletes everything in its first pass and then waits INTERVAL, this never
        # comes: one pass, not `passes`. The timeout is a safety net, not a speed assertion.
        assert pruner.wait_for_passes(passes, timeout=60), \
            f"only {pruner.passes} pruner pass(es) in 60 s, expected {passes} back to back"
    finally:
        pruner.stop()
    return pruner


def test_background_pruner_deletes_at_most_half_the_vacuum_threshold_per_pass_and_catches_up(app, db):
    assert reloption(db, "autovacuum_vacuum_threshold") == "2000"  # migration 0001
    bound = 1000
    insert_finished(db, "done", 9000, "2 days")       # past done's 1 d
    insert_finished(db, "cancelled", 1000, "8 days")  # past cancelled's 7 d
    insert_finished(db, "done", 7, "1 hour")          # within retention: kept
    insert_finished(db, "failed", 5, "2 days")        # within failed's 30 d: kept
    db.execute("INSERT INTO skiplock.jobs (task) SELECT 't' FROM generate_series(1, 4)")  # queued
    db.execute("INSERT INTO skiplock.jobs (task, state, attempts, started_at, owner, lease_expires_at) "
               "VALUES ('t', 'running', 1, now() - interval '40 days', gen_random_uuid(), now() + interval '1 hour')")

    full = math.ceil(10_000 / bound)
    pruner = run_pruner(app, full + 1)

    passes = list(pruner.recent)
    assert [p.deleted for p in passes] == [bound] * full + [0], passes
    assert all(p.limit == bound for p in passes)
    # A full pass is followed by another soon (catch-up); the first short one waits the normal interval.
    assert [p.next_delay for p in passes] == [pruner.catch_up] * full + [INTERVAL]
    assert pruner.passes == full + 1
    assert kept_rows(db) == [("done", 7), ("failed", 5), ("queued", 4), ("running", 1)]


def test_pass_size_follows_the_tables_own_vacuum_threshold(app, db):
    db.execute("ALTER TABLE skiplock.jobs SET (autovacuum_vacuum_threshold = 200)")
    insert_finished(db, "done", 1000, "2 days")
    pruner = run_pruner(app, 11)
    assert [(p.limit, p.deleted) for p in pruner.recent] == [(100, 100)] * 10 + [(100, 0)]
    assert kept_rows(db) == []


def test_manual_prune_still_deletes_everything_at_once(app, db):
    insert_finished(db, "done", 2500, "2 days")
    insert_finished(db, "failed", 3, "31 days")
    assert app.prune() == {"done": 2500, "failed": 3, "cancelled": 0}
    assert kept_rows(db) == []


def test_the_pace_is_measured_on_the_pruners_injected_clock(app, db):
    """A short pass schedules the next one from the rate rows came due, timed on the pruner's clock:
    on a ManualClock the waits are exact, and nothing sleeps."""
    from skiplock.lifecycle import ManualClock

    clock = ManualClock()
    insert_finished(db, "done", 10, "2 days")
    pruner = Pruner(app, 60.0, pass_limit=1000, clock=clock).start()
    try:
        assert clock.wait_for_waits(1)
        assert clock.waits == [60.0]  # the first pass has no predecessor: the normal interval
        insert_finished(db, "done", 999, "2 days")  # 999 rows came due over the 60 s of the clock
        clock.advance(60.0)
        assert clock.wait_for_waits(2)
        # half a pass (500 rows) is due again in 500 x 60 / 999 s -- by the clock, not by time passing
        assert clock.waits[1] == 500 * 60.0 / 999
        assert [p.deleted for p in pruner.recent] == [10, 999]
    finally:
        pruner.stop()


def test_a_prune_with_nothing_due_reads_none_of_the_jobs_still_kept(app, db, dsn):
    """The cutoff is an index condition on jobs_finished_idx (state, finished_at): a prune of a state
    with nothing due stops at the first entry past it, however many finished jobs are still within
    their retention, and never reads another state's jobs older than the cutoff. (With a volatile
    cutoff it was a filter, and such a prune read every one of them: 1,963 buffers for 100,000; with
    the index keyed by finished_at alone, it read every failed job older than a day.)"""
    insert_finished(db, "done", 30_000, "1 hour")
    insert_finished(db, "failed", 20_000, "2 days")
    db.execute("VACUUM ANALYZE skiplock.jobs")
    root = plan(dsn, app.backend.q["prune"], {"state": "done", "age": 86400, "batch": 500}, analyze=True,
                mode="force_custom_plan")  # (rolled back)
    walks = [n for n in nodes(root) if n.get("Index Name") == "jobs_finished_idx"]
    assert walks, root
    assert "state = " in walks[0].get("Index Cond", ""), walks[0]
    assert "finished_at <" in walks[0].get("Index Cond", ""), walks[0]
    read = walks[0].get("Shared Hit Blocks", 0) + walks[0].get("Shared Read Blocks", 0)
    assert read <= 10, (read, walks[0])  # a descent: neither the 30,000 done jobs kept nor the failed ones
    assert walks[0].get("Actual Rows") == 0
