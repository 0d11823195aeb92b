"""One duration syntax for every duration option (30s, 5m, 1h, 1d, 2w, or seconds), bad values as one
line with exit 2; the global options accepted after the command as well as before it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from cli_support import ok, one_error_line, one_json_document, run


@pytest.mark.parametrize("text, seconds", [("90", 90), ("0.5", 0.5), ("30s", 30), ("5m", 300), ("1h", 3600),
                                           ("1d", 86400), ("2w", 1209600), ("250ms", 0.25)])
def test_duration_syntax(text, seconds):
    from skiplock.cli.params import parse_duration

    assert parse_duration(text) == seconds


def test_enqueue_delay_takes_a_duration(dsn, db):
    # "5m from now": now is some moment while the command runs (the client and the server share a clock
    # here), so the bounds are the command's own start and end -- not an assumption about its speed.
    before = datetime.now(timezone.utc)
    job_id = int(ok(run(dsn, "enqueue", "effect", "--delay", "5m")).stdout)
    after = datetime.now(timezone.utc)
    (run_at,) = db.execute("SELECT run_at FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()
    slack = timedelta(milliseconds=50)  # timestamp rounding between the two clocks' readers
    assert before + timedelta(minutes=5) - slack <= run_at <= after + timedelta(minutes=5) + slack, (before, run_at, after)


def test_outbox_prune_takes_a_duration(dsn, db):
    sent = ok(run(dsn, "outbox", "put", "t", "--payload", "1")).stdout.split()[0]
    db.execute("UPDATE skiplock.outbox SET state = 'sent', finished_at = now() - interval '2 days' WHERE id = %s",
               [int(sent)])
    assert "deleted 0 sent" in ok(run(dsn, "outbox", "prune", "--older-than", "3d")).stdout
    assert "deleted 1 sent" in ok(run(dsn, "outbox", "prune", "--older-than", "1d")).stdout


BAD_DURATIONS = {
    "enqueue --delay": ["enqueue", "effect", "--delay", "5 minutes"],
    "prune --done": ["prune", "--done", "soon"],
    "prune --failed": ["prune", "--failed", "-1d"],
    "outbox prune": ["outbox", "prune", "--older-than", "1y"],
    "wait --timeout": ["wait", "1", "--timeout", "nan"],
    "cancel --wait": ["cancel", "1", "--wait", "2h"],  # more than its bound, 1 h
    "worker --poll-interval": ["worker", "--app", "cli_tasks:app", "--poll-interval", "fast"],
    "relay --timeout": ["relay", "--webhook", "http://127.0.0.1:9/", "--timeout", "10x"],
}


@pytest.mark.parametrize("case", list(BAD_DURATIONS))
def test_a_bad_duration_is_one_line_and_exit_2(dsn, db, case):
    line = one_error_line(run(dsn, *BAD_DURATIONS[case]))
    assert "--" in line and ("duration" in line or "longer than" in line), line
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone() == (0,)


def test_a_usage_error_is_one_line(dsn):
    line = one_error_line(run(dsn, "jobs", "--no-such-option"))
    assert "--no-such-option" in line and "skiplock jobs --help" in line.replace("python -m ", ""), line


def test_global_options_after_the_command(dsn, empty_dsn):
    ok(run(None, "migrate", "--dsn", empty_dsn, "--schema", "late"))
    job_id = ok(run(None, "enqueue", "effect", "--schema", "late", "--dsn", empty_dsn)).stdout.strip()
    doc = one_json_document(run(None, "status", "--json", "--dsn", empty_dsn, "--schema", "late"))
    assert doc["schema"] == "late" and doc["counts"]["default"]["queued"] == 1, doc
    listed = one_json_document(run(None, "jobs", "--json", "-q", "--dsn", empty_dsn, "--schema", "late"))
    assert [str(j["id"]) for j in listed["jobs"]] == [job_id]
    # in a subcommand of a group too, and after the command the later value wins
    shown = one_json_document(run(None, "--dsn", "host=127.0.0.1 port=1", "outbox", "--json", "--dsn", empty_dsn,
                                  "--schema", "late"))
    assert shown["schema"] == "late" and shown["messages"] == []
