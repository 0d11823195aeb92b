"""Connection budget: a worker with more slots than the server lets its role open connections fails
fast with one line naming the numbers, instead of taking every connection (producers then get "too
many clients") and retrying for ever. A worker that fits leaves room for producers."""

from __future__ import annotations

import subprocess
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

import skiplock
from skiplock.errors import ConfigurationError

from support import cli_argv, cli_env, wait_for

ACCEPTANCE = Path(__file__).resolve().parents[1] / "acceptance"  # tasks_app lives there
LIMIT = 10


@pytest.fixture
def role_dsn(dsn, db, pg_admin_dsn):
    """A non-superuser role (CONNECTION LIMIT does not apply to superusers) limited to LIMIT
    connections, allowed to use the skiplock schema of the test database."""
    role = f"skiplock_budget_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    password = uuid.uuid4().hex  # the server checks passwords on every connection
    db.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT {} PASSWORD {}").format(
        ident, sql.Literal(LIMIT), sql.Literal(password)))
    for grant in ("GRANT USAGE ON SCHEMA skiplock TO {}", "GRANT ALL ON ALL TABLES IN SCHEMA skiplock TO {}",
                  "GRANT ALL ON ALL SEQUENCES IN SCHEMA skiplock TO {}",
                  ):
        db.execute(sql.SQL(grant).format(ident))
    parts = {k: v for k, v in conninfo.conninfo_to_dict(dsn).items() if k != "passfile"}
    yield conninfo.make_conninfo(**{**parts, "user": role, "password": password})
    db.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s", [role])
    db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
    db.execute(sql.SQL("DROP ROLE {}").format(ident))


def role_sessions(db, dsn_of_role) -> int:
    user = conninfo.conninfo_to_dict(dsn_of_role)["user"]
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [user]).fetchone()[0]


def test_an_over_provisioned_worker_fails_fast_with_one_line_naming_the_numbers(role_dsn, db, tmp_path):
    argv = cli_argv(role_dsn, "worker", "--app", "tasks_app:app", "--concurrency", "8")
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(argv, cwd=ACCEPTANCE, env=cli_env(ACCEPTANCE), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
        try:
            code = proc.wait(timeout=60)  # a safety net: it must exit on its own, at once
        except subprocess.TimeoutExpired:
            sessions = role_sessions(db, role_dsn)
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"the worker kept running (holding {sessions} of the role's {LIMIT} connections):\n"
                                 f"{(tmp_path / 'err').read_text()[-2000:]}") from None
    stderr = (tmp_path / "err").read_text()
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert "8 slot(s)" in line and "needs 18" in line and "2 per slot" in line, line
    assert f"CONNECTION LIMIT {LIMIT}" in line and "can be opened" in line, line
    assert "lower concurrency (--concurrency) to 2" in line, line
    # nothing was taken from producers: the role can still enqueue
    producer = skiplock.App(role_dsn)
    try:
        producer.enqueue("effect")
    finally:
        producer.close()


def test_the_same_refusal_in_process(role_dsn):
    app = skiplock.App(role_dsn)
    try:
        with pytest.raises(ConfigurationError, match=r"not enough database connections for 6 slot\(s\)"):
            app.worker(concurrency=6, handle_signals=False).run(stop_when_empty=True)
    finally:
        app.close()


def test_a_worker_that_fits_leaves_room_for_producers(role_dsn, db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL)")
    db.execute(sql.SQL("GRANT ALL ON effects TO {}").format(sql.Identifier(conninfo.conninfo_to_dict(role_dsn)["user"])))
    worker_app = skiplock.App(role_dsn)
    done = threading.Event()

    @worker_app.task(name="effect")
    def effect(job):
        job.conn.execute("INSERT INTO effects VALUES (%s)", [job.id])
        done.set()

    worker = worker_app.worker(concurrency=2, handle_signals=False, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    producer = skiplock.App(role_dsn)
    try:
        worker.started.wait(30)
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                                    "'skiplock-worker %%'").fetchone()[0] == 2, 30, "the 2 lease connections")
        ids = producer.enqueue_many([("effect", {})] * 5)  # the producer still gets a connection
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                                    [ids]).fetchone()[0] == 5, 30, "the jobs to be done")
        assert role_sessions(db, role_dsn) <= LIMIT
    finally:
        worker.stop()
        thread.join(30)
        producer.close()
        worker_app.close()
