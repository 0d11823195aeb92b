"""examples/django end to end, in real processes on the real server: ``manage.py migrate`` (skiplock's
schema by its migration), requests through the real views (ATOMIC_REQUESTS), ``manage.py skiplock
worker --stop-when-empty``, ``status``, and the results as the Tasks framework reports them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from support import wait_for


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"


TOKEN = "viewer-token-of-the-django-example"


def example_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "DJANGO_"))}
    env["SKIPLOCK_EXAMPLE_DSN"] = dsn
    return env


def run(args: list[str], dsn: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=EXAMPLE, env=env or example_env(dsn), capture_output=True,
                          text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_the_example_project_end_to_end(empty_dsn, db_on):
    run(["manage.py", "migrate", "-v", "0"], empty_dsn)
    db = db_on(empty_dsn)
    assert db.execute("select count(*) from skiplock.jobs").fetchone() == (0,)  # the schema, by migrate

    placed = [json.loads(line) for line in run(["try_it.py", "book", "declined", "fail:lamp"], empty_dsn).stdout.splitlines()]
    assert [p["code"] for p in placed] == [200, 200, 500]
    assert db.execute("select item from shop_orders order by id").fetchall() == [("book",), ("declined",)]
    assert db.execute("select task, queue, priority from skiplock.jobs order by id").fetchall() == [
        ("shop.tasks.charge", "default", -10), ("shop.tasks.charge", "default", -10)]  # none for the failed view

    worker = run(["manage.py", "skiplock", "worker", "--stop-when-empty", "--concurrency", "2"], empty_dsn)
    assert "stopped: 2 done, 1 retried, 1 failed" in worker.stderr, worker.stderr
    status = json.loads(run(["manage.py", "skiplock", "status", "--json"], empty_dsn).stdout)
    assert status["schema"] == "skiplock", status  # the settings' database and schema
    assert status["counts"]["default"]["done"] == 1 and status["counts"]["default"]["failed"] == 1, status
    assert status["counts"]["emails"]["done"] == 1, status
    assert "password" not in worker.stderr.lower() + json.dumps(status).lower()

    assert db.execute("select item, status, charged_at is not null from shop_orders order by id").fetchall() == [
        ("book", "charged", True), ("declined", "new", False)]
    assert db.execute("select text from shop_emails").fetchall() == [("receipt for order 1",)]
    states = db.execute("select task, state, attempts from skiplock.jobs order by id").fetchall()
    assert states == [("shop.tasks.charge", "done", 1), ("shop.tasks.charge", "failed", 2),
                      ("shop.tasks.send_receipt", "done", 1)]

    ok_id, bad_id = placed[0]["body"]["result_id"], placed[1]["body"]["result_id"]
    results = [json.loads(line)["body"] for line in
               run(["try_it.py", f"result:{ok_id}", f"result:{bad_id}"], empty_dsn).stdout.splitlines()]
    assert results[0] == {"status": "SUCCESSFUL", "errors": [], "return_value": {"order": 1, "status": "charged"}}
    assert results[1]["status"] == "FAILED" and results[1]["errors"] == ["builtins.ValueError"] * 2

    # manage.py skiplock dashboard: the same database, closed without its token
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(example_env(empty_dsn), SKIPLOCK_DASHBOARD_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "manage.py", "skiplock", "dashboard", "--port", str(port)], cwd=EXAMPLE,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/api/overview"

        def up():
            try:
                return httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2)
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
                return None

        overview = wait_for(up, what="the dashboard to answer")
        assert overview.status_code == 200 and {"queue": "emails", "state": "done", "count": 1} in overview.json()["counts"]
        assert httpx.get(url, timeout=2).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_manage_py_skiplock_bad_input_is_one_line_exit_2():
    """Refused before anything connects (the DSN names no server): the CLI's one line, exit 2."""
    done = run(["manage.py", "skiplock", "worker", "--concurrency", "0"], "dbname=nothing host=/nonexistent",
               check=False)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--concurrency" in done.stderr


# The example's settings with another schema: what manage.py skiplock reads from them.
OTHER_SETTINGS = """
from shopsite.settings import *  # noqa: F401,F403
from shopsite.settings import TASKS

TASKS = {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], "SCHEMA": "shop_jobs"}}}
"""


def test_manage_py_skiplock_migrate_worker_and_status_read_schema_and_queues_from_settings(empty_dsn, db_on, tmp_path):
    """``manage.py skiplock migrate`` creates skiplock's tables in the settings' SCHEMA (not the default
    one); ``enqueue`` and ``status`` use that schema; ``worker`` serves the settings' QUEUES only
    (``default`` and ``emails``: a job of another queue stays queued, untouched)."""
    (tmp_path / "other_settings.py").write_text(OTHER_SETTINGS)
    env = dict(example_env(empty_dsn), DJANGO_SETTINGS_MODULE="other_settings",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(EXAMPLE)]))
    run(["manage.py", "skiplock", "migrate"], empty_dsn, env=env)
    db = db_on(empty_dsn)
    schemas = {r[0] for r in db.execute("select nspname from pg_namespace where nspname in ('skiplock', 'shop_jobs')")}
    assert schemas == {"shop_jobs"}
    enqueued = run(["manage.py", "skiplock", "enqueue", "shop.tasks.send_receipt", "--queue", "other",
                    "--args", '{"args": [1], "kwargs": {}}'], empty_dsn, env=env)
    job_id = int(enqueued.stdout.split()[-1])
    worker = run(["manage.py", "skiplock", "worker", "--stop-when-empty", "--concurrency", "1"], empty_dsn, env=env)
    assert "password" not in worker.stderr.lower()
    assert db.execute("select queue, state, attempts from shop_jobs.jobs where id = %s", [job_id]).fetchone() == (
        "other", "queued", 0)
    status = json.loads(run(["manage.py", "skiplock", "status", "--json"], empty_dsn, env=env).stdout)
    assert status["schema"] == "shop_jobs" and status["counts"]["other"]["queued"] == 1, status
