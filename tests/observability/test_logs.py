"""The worker's log lines (observability/reporting.py) on real workers, and the JSON log format of
the CLI (``skiplock --log-format json worker``)."""

from __future__ import annotations

import json
import logging
import textwrap
import threading

import pytest

from skiplock.observability.logs import JsonFormatter

from support import run_cli, wait_for

SECRET_ARG = "hunter2-in-the-args"


def worker_lines(caplog, level=logging.DEBUG):
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "skiplock.worker"
            and r.levelno >= level]


def test_one_info_line_per_finished_job_warning_for_a_retry_error_for_failed(app, caplog):
    @app.task(name="ok")
    def ok(job, secret):
        return None

    @app.task(name="boom", max_attempts=2, retry=0)
    def boom(job, secret):
        raise ValueError("mailbox full")

    done_id = app.enqueue("ok", {"secret": SECRET_ARG})
    failed_id = app.enqueue("boom", {"secret": SECRET_ARG})
    with caplog.at_level(logging.INFO, logger="skiplock"):
        app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    lines = worker_lines(caplog, logging.INFO)
    done = [m for lvl, m in lines if m.startswith(f"job {done_id} ")]
    assert len(done) == 1 and done[0].startswith(f"job {done_id} (ok) done in ") and done[0].endswith(
        "attempt 1/5"), lines
    assert [lvl for lvl, _ in lines if lvl == "INFO" and f"job {done_id} " in _] == ["INFO"]
    boom_lines = [(lvl, m) for lvl, m in lines if m.startswith(f"job {failed_id} ")]
    assert [lvl for lvl, _ in boom_lines] == ["WARNING", "ERROR"], boom_lines
    assert "attempt 1/2 failed" in boom_lines[0][1] and "retrying in 0s: ValueError: mailbox full" in boom_lines[0][1]
    assert boom_lines[1][1].startswith(f"job {failed_id} (boom) failed in ") and boom_lines[1][1].endswith(
        "attempt 2/2: ValueError: mailbox full")
    assert not [m for m in caplog.messages if SECRET_ARG in m]  # args never logged


def test_claims_and_batches_are_logged_at_debug(app, caplog):
    @app.task(name="fast")
    def fast(job):
        pass

    app.enqueue_many([("fast", {}) for _ in range(20)])
    with caplog.at_level(logging.DEBUG, logger="skiplock.worker"):
        app.worker(concurrency=1, handle_signals=False, batch_size=8).run(stop_when_empty=True)
    debug = [m for lvl, m in worker_lines(caplog) if lvl == "DEBUG"]
    assert any(" claimed " in m and "job(s)" in m for m in debug), debug
    assert any("batch" in m and "committed" in m for m in debug), debug


def test_a_cancelled_running_job_is_logged_as_a_cancel(app, caplog):
    running, hold = threading.Event(), threading.Event()

    @app.task(name="slow")
    def slow(job):
        running.set()
        while not hold.is_set():
            job.conn.execute("SELECT pg_sleep(0.05)")

    job_id = app.enqueue("slow")
    worker = app.worker(concurrency=1, handle_signals=False)
    with caplog.at_level(logging.INFO, logger="skiplock"):
        thread = threading.Thread(target=worker.run, kwargs={"stop_when_empty": True})
        thread.start()
        try:
            assert running.wait(30)
            assert app.cancel_job(job_id) == "cancelled"
        finally:
            hold.set()
            thread.join(30)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("skiplock")]
    assert [m for lvl, m in messages if m.startswith(f"job {job_id} (slow) cancelled")], messages
    assert not [m for lvl, m in messages if "connection lost" in m or lvl in ("WARNING", "ERROR")], messages


def test_json_formatter_one_object_per_line_with_no_password():
    record = logging.LogRecord("skiplock.worker", logging.WARNING, __file__, 1,
                               "cannot reach postgresql://me:s3cret-pass-word@db/x", (), None)
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "WARNING" and entry["logger"] == "skiplock.worker"
    assert "s3cret-pass-word" not in line and entry["message"].startswith("cannot reach postgresql://me:")


@pytest.mark.parametrize("after", [False, True], ids=["before the command", "after the command"])
def test_the_cli_worker_logs_json_lines(dsn, tmp_path, after):
    (tmp_path / "jsonapp.py").write_text(textwrap.dedent("""
        import skiplock
        app = skiplock.App()

        @app.task(name="hello")
        def hello(job):
            return "hi"
    """))
    enqueued = run_cli(dsn, "enqueue", "hello", "--args", "{}", cwd=tmp_path)
    assert enqueued.returncode == 0, enqueued.stderr
    args = ["worker", "--app", "jsonapp:app", "--concurrency", "1", "--stop-when-empty"]
    args = args + ["--log-format", "json"] if after else ["--log-format", "json", *args]
    result = run_cli(dsn, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert [e for e in entries if e["logger"] == "skiplock.worker" and " (hello) done in " in e["message"]], entries
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
