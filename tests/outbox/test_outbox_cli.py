"""The outbox commands of the real CLI, as subprocesses: listing dead letters, redrive, put, relay with each
kind of sink, and bad input as one clear line (exit 2) with no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from outbox_receiver import Action
from outbox_support import row, states

HERE = Path(__file__).resolve().parent


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(extra or {})})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def cli_argv(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "skiplock", "--quiet", "--dsn", dsn, *args]


def run_cli(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_argv(dsn, *args), cwd=HERE, env=cli_env(env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def clean_failure(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    out = result.stdout + result.stderr
    assert result.returncode == code, f"exit {result.returncode}, wanted {code}\n{out}"
    assert "Traceback" not in out, out
    lines = [line for line in result.stderr.splitlines() if line.strip() and " INFO skiplock" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


BAD_INPUT = [
    (("outbox", "put", "", "--payload", "{}"), "topic must be a non-empty string"),
    (("outbox", "put", "t", "--payload", "{not json"), "--payload is not valid JSON"),
    (("outbox", "put", "t", "--payload", "{}", "--idempotency-key", "a b"), "visible ASCII"),
    (("outbox", "redrive", "424242"), "no outbox message with id 424242"),
    (("outbox", "redrive"), "give message ids or --failed"),
    (("outbox", "show", "424242"), "no outbox message with id 424242"),
    (("relay",), "give exactly one sink"),
    (("relay", "--webhook", "ftp://example.com"), "http:// or https://"),
    (("relay", "--webhook", "http://127.0.0.1:9/x", "--enqueue"), "give exactly one sink"),
    (("relay", "--sink", "nonexistent_module:x"), "cannot import 'nonexistent_module'"),
    (("relay", "--sink", "outbox_cli_sinks:not_a_sink"), "neither a sink"),
    (("relay", "--enqueue", "--header", "A: b"), "--header and --timeout go with --webhook"),
]


def test_bad_input_is_one_clear_line(dsn, db):
    # The commands are independent: run them side by side (a CLI start costs most of each).
    procs = [(args, message, subprocess.Popen(cli_argv(dsn, *args), cwd=HERE, env=cli_env(), stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for args, message in BAD_INPUT]
    for args, message, proc in procs:
        out, err = proc.communicate(timeout=60)
        line = clean_failure(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert message in line, (args, line)
    assert states(db) == {}


def test_put_list_failed_show_and_redrive(dsn, db, app, receiver):
    put = run_cli(dsn, "outbox", "put", "orders.created", "--payload", '{"order": 1}', "--key", "c1",
                  "--max-attempts", "1")
    assert put.returncode == 0, put.stderr
    message_id, idempotency_key = put.stdout.split()
    message_id = int(message_id)
    assert row(db, message_id)["idempotency_key"] == idempotency_key

    receiver.script = lambda r: Action(status=500)
    relayed = run_cli(dsn, "relay", "--webhook", receiver.url, "--stop-when-empty", "--timeout", "60")
    assert relayed.returncode == 0, relayed.stderr
    assert "0 sent, 0 retried, 1 failed" in relayed.stderr

    listing = run_cli(dsn, "outbox", "--failed")
    assert listing.returncode == 0 and str(message_id) in listing.stdout and "HTTP 500" in listing.stdout
    shown = run_cli(dsn, "outbox", "show", str(message_id))
    assert "gave up after attempt 1/1" in shown.stdout and '{"order": 1}' in shown.stdout

    receiver.script = None
    redrove = run_cli(dsn, "outbox", "redrive", str(message_id))
    assert redrove.stdout.strip() == f"redrove 1 message(s): {message_id}"
    assert clean_failure(run_cli(dsn, "outbox", "redrive", str(message_id))).endswith(f"{message_id} is pending")
    relayed = run_cli(dsn, "relay", "--sink", "outbox_cli_sinks:webhook_from_env", "--stop-when-empty",
                      env={"TEST_WEBHOOK": receiver.url})
    assert relayed.returncode == 0, relayed.stderr
    assert row(db, message_id)["state"] == "sent" and receiver.effect_count() == 1
    assert run_cli(dsn, "outbox", "--failed").stdout.count("orders.created") == 0


def test_redrive_all_failed_of_a_topic(dsn, db, app):
    refs = app.outbox.put_many([("a", 1), ("a", 2), ("b", 3)])
    db.execute("UPDATE skiplock.outbox SET state = 'failed', finished_at = now(), last_error = 'x'")
    out = run_cli(dsn, "outbox", "redrive", "--failed", "--topic", "a")
    assert out.stdout.strip() == f"redrove 2 message(s): {refs[0].id}, {refs[1].id}"
    assert states(db) == {"pending": 2, "failed": 1}


def test_relay_enqueue_fans_out_into_jobs(dsn, db, app):
    app.outbox.put_many([("send_email", {"to": "a@example.com"}), ("send_email", {"to": "b@example.com"})])
    out = run_cli(dsn, "relay", "--enqueue", "--stop-when-empty")
    assert out.returncode == 0, out.stderr
    assert "(transaction lease)" in out.stderr
    got = db.execute("SELECT task, args FROM skiplock.jobs ORDER BY id").fetchall()
    assert got == [("send_email", {"to": "a@example.com"}), ("send_email", {"to": "b@example.com"})]
    assert json.loads(json.dumps(states(db))) == {"sent": 2}
