"""``skiplock worker --stop-when-empty`` does not walk away from a retry due in a moment, and says
what it leaves behind."""

from __future__ import annotations

from cli_support import ok, run

WORKER = ("worker", "--app", "cli_tasks:app", "--concurrency", "1", "--poll-interval", "0.05", "--no-maintenance",
          "--stop-when-empty")


def test_stop_when_empty_waits_for_a_retry_due_soon(dsn, db):
    job_id = int(ok(run(dsn, "enqueue", "flaky", "--app", "cli_tasks:app")).stdout)
    ok(run(dsn, *WORKER))
    assert db.execute("SELECT state, attempts FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone() == ("done", 2)


def test_stop_when_empty_says_what_it_left_behind(dsn, db):
    later = int(ok(run(dsn, "enqueue", "flaky", "--app", "cli_tasks:app", "--delay", "1h")).stdout)
    other = int(ok(run(dsn, "enqueue", "not.this.apps.task")).stdout)  # not this worker's: not its business
    result = ok(run(dsn, *WORKER))
    assert db.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [later]).fetchone() == ("queued",)
    left = [line for line in result.stderr.splitlines() if "left behind" in line]
    assert len(left) == 1 and "1 queued job(s) of this app's tasks due later" in left[0], result.stderr
    assert "in 59 min" in left[0] or "in 1 h" in left[0], left
    assert other


def test_due_within_zero_does_not_wait(dsn, db):
    job_id = int(ok(run(dsn, "enqueue", "flaky", "--app", "cli_tasks:app")).stdout)
    result = ok(run(dsn, *WORKER, "--due-within", "0"))
    assert db.execute("SELECT state, attempts FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone() == ("queued", 1)
    assert "left behind: 1 queued job(s)" in result.stderr, result.stderr
