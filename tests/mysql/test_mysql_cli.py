"""Every ``skiplock`` command on a ``mariadb://`` DSN (issue 12, item 6), run as the real CLI against
the private MariaDB: migrate, enqueue, jobs, queues, pause/resume, cancel, retry, worker, status,
workers, top, prune, wait, outbox, relay, scenario.

What the MySQL backend does not have yet (issue 12's remaining verbs) must not end in a traceback:
such a command prints one line, ``error: not supported on this database: …``, and exits 2, as any
other bad input; once the backend has the verb, the same test checks the command's real output.
The DSN goes through ``SKIPLOCK_DSN``; its password never appears in any output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from mariadb_server import MariaDB, drop_database, fresh_database
from private_servers import free_port
from support import cli_env

HERE = Path(__file__).resolve().parent
NOT_SUPPORTED = "error: not supported on this database: "


@pytest.fixture(scope="module")
def db(mariadb_server: MariaDB) -> Iterator[tuple[str, str]]:
    """(a ``mariadb://`` DSN of a fresh database for this module, the database's name)."""
    name = fresh_database(mariadb_server)
    with mariadb_server.connect(name) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE cli_effects (job_id BIGINT NOT NULL, total INT NOT NULL) ENGINE=InnoDB")
    yield "mariadb://" + mariadb_server.dsn(name)[len("mysql://"):], name
    drop_database(mariadb_server, name)


def cli(dsn: str, *args: str, password: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "skiplock", "--quiet", *args], cwd=HERE,
                          env=cli_env(HERE, SKIPLOCK_DSN=dsn), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert password not in done.stdout + done.stderr
    return done


def works_or_says_so(done: subprocess.CompletedProcess[str]) -> bool:
    """True if the command worked (exit 0); else it must be the one-line 'not supported' error, exit 2."""
    if done.returncode == 0:
        return True
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and errors[0].startswith(NOT_SUPPORTED), (
        done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "MySQL/MariaDB" in errors[0] or "MySQL" in errors[0]
    return False


def rows(server: MariaDB, database: str, query: str) -> list[tuple[Any, ...]]:
    with server.connect(database) as c, c.cursor() as cur:
        cur.execute(query)
        return [tuple(r) for r in cur.fetchall()]


def test_every_command_on_a_mariadb_dsn(db: tuple[str, str], mariadb_server: MariaDB) -> None:
    dsn, database = db
    pw = mariadb_server.password

    def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return cli(dsn, *args, password=pw, **kw)

    assert run("jobs").returncode == 3  # no schema yet: SchemaError, one line, exit 3 as on PostgreSQL
    done = run("migrate")
    assert done.returncode == 0 and "applied migration" in done.stdout, done.stderr
    assert run("migrate").returncode == 0  # twice: nothing left to apply

    # enqueue (with the app: its options applied), a unique key twice, bad input
    ids = [int(run("enqueue", "mycli.add", "--app", "mysql_cli_tasks:app", "--args", json.dumps({"a": i, "b": 1}))
               .stdout.strip()) for i in range(3)]
    first = run("enqueue", "mycli.add", "--app", "mysql_cli_tasks:app", "--args", '{"a": 10, "b": 1}',
                "--unique-key", "k1")
    again = run("enqueue", "mycli.add", "--app", "mysql_cli_tasks:app", "--args", '{"a": 10, "b": 1}',
                "--unique-key", "k1")
    assert first.returncode == 0 and again.returncode == 0, again.stderr
    assert first.stdout.split()[0] == again.stdout.split()[0]  # the existing job's id
    failing = int(run("enqueue", "mycli.fail", "--app", "mysql_cli_tasks:app").stdout.strip())
    bad = run("enqueue", "mycli.add", "--args", "{not json")
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1

    # reads
    listed = json.loads(run("jobs", "--json").stdout)
    assert {j["id"] for j in listed["jobs"]} >= set(ids) | {failing}
    one = run("jobs", str(ids[0]))
    assert one.returncode == 0 and "mycli.add" in one.stdout
    assert run("jobs", "999999").returncode != 0
    queues = json.loads(run("queues", "--json").stdout)
    assert any(q["queue"] == "default" for q in (queues["queues"] if isinstance(queues, dict) else queues))

    # pause / resume
    assert run("pause", "default").returncode == 0
    assert "paused" in run("queues").stdout
    assert run("resume", "default").returncode == 0

    # cancel a queued job, put it back
    victim = ids[2]
    assert run("cancel", str(victim)).returncode == 0
    assert rows(mariadb_server, database, f"SELECT state FROM skiplock_jobs WHERE id = {victim}") == [("cancelled",)]
    assert run("retry", str(victim)).returncode == 0
    assert rows(mariadb_server, database, f"SELECT state FROM skiplock_jobs WHERE id = {victim}") == [("queued",)]

    # a worker drains everything: each handler's write commits with its job, exactly once
    worker = run("worker", "--app", "mysql_cli_tasks:app", "--stop-when-empty", "--concurrency", "2",
                 "--poll-interval", "0.05", "--no-maintenance", timeout=120)
    works_or_says_so(worker)
    states = dict(rows(mariadb_server, database, "SELECT id, state FROM skiplock_jobs"))
    assert {states[i] for i in ids} == {"done"} and states[failing] == "failed", (states, worker.stderr[-2000:])
    assert sorted(rows(mariadb_server, database, "SELECT job_id, total FROM cli_effects")) == sorted(
        [(ids[0], 1), (ids[1], 2), (ids[2], 3), (int(first.stdout.split()[0]), 11)])

    # what may not be on the MySQL backend yet: works, or one line and exit 2
    if works_or_says_so(retried := run("retry", "--failed")):
        assert rows(mariadb_server, database, f"SELECT state FROM skiplock_jobs WHERE id = {failing}") == [("queued",)]
    if works_or_says_so(status := run("status")):
        assert "default" in status.stdout
    if works_or_says_so(status_json := run("status", "--json")):
        json.loads(status_json.stdout)
    works_or_says_so(run("workers"))
    works_or_says_so(run("top", "--iterations", "1", "--interval", "0.1"))
    if works_or_says_so(waited := run("wait", str(ids[0]), "--timeout", "5")):
        assert json.loads(waited.stdout) == 1
    works_or_says_so(run("prune", "--done", "0s"))
    check_outbox_commands(run, mariadb_server, database)
    assert retried.returncode in (0, 2)

    done = run("scenario")
    assert done.returncode == 0 and "scenario OK" in done.stdout


def test_the_dashboard_on_mariadb_is_refused_in_one_line_at_start(db: tuple[str, str],
                                                                  mariadb_server: MariaDB) -> None:
    """The web dashboard's statements (job list, bulk actions, throughput, audit log) are not on the
    MySQL backend yet: `skiplock dashboard` says so at once instead of serving pages that fail."""
    dsn, _ = db
    assert cli(dsn, "migrate", password=mariadb_server.password).returncode == 0
    done = cli(dsn, "dashboard", "--port", str(free_port()), password=mariadb_server.password)
    assert not works_or_says_so(done)
    assert "the web dashboard" in done.stderr and "throughput" in done.stderr


def check_outbox_commands(run: Any, server: MariaDB, database: str) -> None:
    """Every ``skiplock outbox`` command and ``relay`` (a webhook, --enqueue) on the MySQL backend."""
    put = run("outbox", "put", "orders.created", "--payload", '{"order": 1}', "--key", "c1", "--max-attempts", "1")
    assert put.returncode == 0, put.stderr
    message_id, idempotency_key = put.stdout.split()
    assert rows(server, database, f"SELECT idempotency_key, state FROM skiplock_outbox WHERE id = {int(message_id)}") == [
        (idempotency_key, "pending")]
    listed = json.loads(run("outbox", "--json").stdout)
    assert [m["id"] for m in listed["messages"]] == [int(message_id)]
    # nothing listens on port 9: a connection error, retryable, but this was the message's last attempt
    relayed = run("relay", "--webhook", "http://127.0.0.1:9/", "--stop-when-empty", "--timeout", "5")
    assert relayed.returncode == 0 and "0 sent, 0 retried, 1 failed" in relayed.stderr, relayed.stderr
    failed = run("outbox", "--failed")
    assert failed.returncode == 0 and message_id in failed.stdout and "orders.created" in failed.stdout
    shown = run("outbox", "show", message_id)
    assert "gave up after attempt 1/1" in shown.stdout and '{"order": 1}' in shown.stdout, shown.stdout
    assert run("outbox", "redrive", message_id).stdout.strip() == f"redrove 1 message(s): {message_id}"
    again = run("outbox", "redrive", message_id)
    assert again.returncode == 2 and f"{message_id} is pending" in again.stderr
    relayed = run("relay", "--enqueue", "--stop-when-empty")  # the message becomes a job, in one transaction
    assert relayed.returncode == 0 and "(transaction lease)" in relayed.stderr, relayed.stderr
    jobs = rows(server, database, "SELECT task, args FROM skiplock_jobs WHERE task = 'orders.created'")
    assert [(task, json.loads(args)) for task, args in jobs] == [("orders.created", {"order": 1})]
    assert json.loads(run("outbox", "--state", "sent", "--json").stdout)["messages"][0]["id"] == int(message_id)
    assert run("outbox", "prune", "--older-than", "0s").stdout.strip() == "deleted 1 sent message(s)"
    assert rows(server, database, "SELECT COUNT(*) FROM skiplock_outbox") == [(0,)]


def test_a_bad_mariadb_dsn_is_one_line(mariadb_server: MariaDB) -> None:
    no_db = "mariadb://" + mariadb_server.admin_dsn[len("mysql://"):]
    done = cli(no_db, "jobs", password=mariadb_server.password)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "must name a database" in done.stderr
    wrong = no_db.replace(mariadb_server.password, "wrong-password") + "nosuchdb"
    done = cli(wrong, "status", password=mariadb_server.password)
    assert done.returncode == 3 and done.stderr.count("error:") == 1 and "wrong-password" not in done.stderr
