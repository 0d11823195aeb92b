"""What ANALYZE of the jobs table reads (migration 19, 0019_jobs_statistics.sql): no statistics for the
payloads, a target of 10 for every other column, so a 3,000-row sample, not 30,000; and when autovacuum
runs it (migration 21: after 20,000 changed rows plus a tenth of the table). (The plan tests --
test_claim_due_first.py, test_claim_of_queues.py, tests/flow/, tests/dashboard/test_scale.py -- run
on statistics made this way.)"""

from __future__ import annotations

import re

import psycopg

PAYLOADS = {"args", "result", "errors", "last_error"}


def test_every_column_of_jobs_has_a_statistics_target_of_at_most_10(db: psycopg.Connection):
    """A column left at the server's default (100) would bring back the 30,000-row sample on its own:
    a later migration that adds a column must give it a target too."""
    rows = db.execute("SELECT attname, attstattarget FROM pg_attribute "
                      "WHERE attrelid = 'skiplock.jobs'::regclass AND attnum > 0 AND NOT attisdropped").fetchall()
    targets = dict(rows)
    assert len(targets) > 20, targets
    unset = sorted(name for name, target in targets.items() if target is None or target < 0)
    assert not unset, f"columns of skiplock.jobs at the default statistics target: {unset}"
    assert {name for name, target in targets.items() if target == 0} == PAYLOADS
    assert max(targets.values()) == 10


def test_analyze_samples_3000_rows(db: psycopg.Connection):
    db.execute("INSERT INTO skiplock.jobs (queue, task, args) "
               "SELECT 'q' || (g % 3), 't', jsonb_build_object('n', g) FROM generate_series(1, 40000) g")
    notices: list[str] = []
    db.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    db.execute("ANALYZE VERBOSE skiplock.jobs")
    sampled = [int(m.group(1)) for m in (re.search(r"(\d+) rows in sample", n) for n in notices) if m]
    assert sampled == [3000], notices



def test_autovacuum_analyzes_jobs_after_20000_changes_and_a_tenth_of_the_table(db: psycopg.Connection):
    """Not after every 5 % (migration 1): at load that was every naptime. Safe because no claim's plan
    needs fresh statistics (test_claim_stale_statistics.py)."""
    options = db.execute("SELECT reloptions FROM pg_class WHERE oid = 'skiplock.jobs'::regclass").fetchone()[0]
    assert "autovacuum_analyze_threshold=20000" in options, options
    assert "autovacuum_analyze_scale_factor=0.1" in options, options
