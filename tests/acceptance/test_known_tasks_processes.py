"""Two applications on one database: a real ``skiplock worker`` of app A serving every queue leaves app
B's queued jobs untouched (during a rolling deploy, say), ``skiplock status`` and ``skiplock jobs`` show
them as jobs no running worker can take, and a worker of app B then runs them."""

from __future__ import annotations

import signal

from acceptance_support import run_cli, scalar, wait_for
from test_cli import table_row_cells


def enqueue(dsn: str, app: str, task: str) -> int:
    result = run_cli(dsn, "enqueue", task, "--app", app)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def test_a_worker_of_app_a_leaves_app_b_jobs_queued_and_status_shows_them(dsn, db, effects, spawn):
    b_jobs = [enqueue(dsn, "app_b:app", "b.effect") for _ in range(3)]  # first in the claim order
    a_jobs = [enqueue(dsn, "tasks_app:app", "effect") for _ in range(3)]
    idle = run_cli(dsn, "status")  # no worker runs yet: every queued job waits, said once
    assert "No worker is running" in idle.stdout and "no running worker can take" not in idle.stdout, idle.stdout
    worker_a = spawn.worker(dsn, concurrency=2)  # tasks_app:app, every queue
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                            [a_jobs]) == 3, what="app A's jobs to be done", on_timeout=worker_a.output)

    rows = db.execute("SELECT state, attempts, last_error, worker FROM skiplock.jobs WHERE id = ANY(%s)",
                      [b_jobs]).fetchall()
    assert rows == [("queued", 0, None, None)] * 3
    assert scalar(db, "SELECT count(*) FROM skiplock.job_attempts WHERE job_id = ANY(%s)", [b_jobs]) == 0
    assert scalar(db, "SELECT count(*) FROM effects WHERE job_id = ANY(%s)", [b_jobs]) == 0

    status = run_cli(dsn, "status")
    assert status.returncode == 0, status.stderr
    assert "no running worker can take" in status.stdout, status.stdout
    cells = table_row_cells(status.stdout)
    assert ["default", "b.effect", "3"] in cells, status.stdout
    assert not any(row[:2] == ["default", "effect"] for row in cells), status.stdout

    listing = run_cli(dsn, "jobs")
    assert listing.returncode == 0, listing.stderr
    state_of = {int(row[0]): row[3] for row in table_row_cells(listing.stdout) if row[0].isdigit()}
    assert [state_of[i] for i in b_jobs] == ["queued*"] * 3, listing.stdout
    assert [state_of[i] for i in a_jobs] == ["done"] * 3, listing.stdout
    assert "queued*: no running worker can take it" in listing.stdout

    worker_a.signal(signal.SIGTERM)
    assert worker_a.wait() == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.workers") == 0  # its row went with it
    assert scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'queued'", [b_jobs]) == 3

    worker_b = spawn.worker(dsn, app="app_b:app", stop_when_empty=True)  # the release that knows them
    assert worker_b.wait() == 0, worker_b.output()
    assert scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'", [b_jobs]) == 3
    assert scalar(db, "SELECT count(*) FROM effects WHERE job_id = ANY(%s)", [b_jobs]) == 3
    status = run_cli(dsn, "status")
    assert "no running worker can take" not in status.stdout and "No worker" not in status.stdout, status.stdout
