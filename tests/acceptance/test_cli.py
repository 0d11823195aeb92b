"""The ``skiplock`` command line, run as a subprocess against a real PostgreSQL: the happy path, bad input
(one clear line, exit 2, nothing written), unreachable servers and foreign schemas (exit 3), and
hostile queue names handled as data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skiplock
from acceptance_support import effects_of, job_row, run_cli, scalar
from tasks_app import SMALL_ARGS_LIMIT

UNREACHABLE = "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2"
INFO_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) skiplock")


def assert_clean_failure(result, code: int) -> str:
    """Exit ``code``, no traceback, and exactly one error line on stderr (returned). A worker's INFO
    log lines (its start-up banner) are not errors and are left out."""
    out = result.stdout + result.stderr
    assert result.returncode == code, f"exit {result.returncode}, wanted {code}\n{out}"
    assert "Traceback" not in out, out
    lines = [line for line in result.stderr.splitlines() if line.strip() and not INFO_LOG.match(line)]
    assert len(lines) == 1, f"expected one error line, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the rich table row whose first cell is ``first_cell``."""
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r} in:\n{text}")


def table_row_cells(text: str) -> list[list[str]]:
    """The cells of every rich table row (header included)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]
        if cells and cells[0]:
            rows.append(cells)
    return rows


def jobs_count(db) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.jobs")


# ---- schema ---------------------------------------------------------------------------------------


def test_status_before_migrate_then_migrate_twice(empty_dsn):
    before = run_cli(empty_dsn, "status")
    line = assert_clean_failure(before, 3)
    assert "skiplock migrate" in line

    first = run_cli(empty_dsn, "migrate")
    assert first.returncode == 0, first.stderr
    assert "applied migration" in first.stdout
    second = run_cli(empty_dsn, "migrate")
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout

    after = run_cli(empty_dsn, "status")
    assert after.returncode == 0, after.stderr
    assert "(no jobs)" in after.stdout


def test_newer_schema_version_asks_to_upgrade_skiplock(dsn, db):
    db.execute("INSERT INTO skiplock.schema_version (version) VALUES (999)")
    for command in (["status"], ["migrate"], ["enqueue", "effect"]):
        result = run_cli(dsn, *command)
        line = assert_clean_failure(result, 3)
        assert "999" in line and "upgrade skiplock" in line, (command, line)
    assert jobs_count(db) == 0


@pytest.mark.parametrize("schema", ["we%ird", "[/bold] [x", "é" * 31 + "a"], ids=["percent", "markup", "63-bytes"])
def test_any_schema_name_works_from_the_command_line(empty_dsn, schema):
    assert run_cli(empty_dsn, "--schema", schema, "migrate").returncode == 0
    enq = run_cli(empty_dsn, "--schema", schema, "enqueue", "effect")
    assert enq.returncode == 0, enq.stderr
    for command in (["status"], ["queues"], ["jobs"], ["jobs", enq.stdout.strip()]):
        result = run_cli(empty_dsn, "--schema", schema, *command)
        assert result.returncode == 0, (command, result.stdout + result.stderr)
    status = run_cli(empty_dsn, "--schema", schema, "status")
    assert schema in status.stdout, status.stdout
    assert table_row(status.stdout, "default")[1:] == ["1", "0", "0", "0", "0", "0"]


def test_schema_name_over_63_bytes_is_bad_input(empty_dsn):
    line = assert_clean_failure(run_cli(empty_dsn, "--schema", "é" * 32, "migrate"), 2)
    assert "63 bytes" in line, line


# ---- the happy path -------------------------------------------------------------------------------


def test_enqueue_then_inspect(dsn, db):
    enq = run_cli(dsn, "enqueue", "effect", "--args", '{"x": 1}')
    assert enq.returncode == 0, enq.stderr
    assert re.fullmatch(r"\d+", enq.stdout.strip()), enq.stdout
    job_id = int(enq.stdout.strip())
    row = job_row(db, job_id)
    assert (row["task"], row["args"], row["queue"], row["state"]) == ("effect", {"x": 1}, "default", "queued")

    detail = run_cli(dsn, "jobs", str(job_id))
    assert detail.returncode == 0, detail.stderr
    fields = {}
    for line in detail.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1].strip()
    assert fields["id"] == str(job_id)
    assert fields["task"] == "effect"
    assert fields["state"] == "queued"
    assert json.loads(fields["args"]) == {"x": 1}

    other = run_cli(dsn, "enqueue", "effect", "--queue", "other")
    assert other.returncode == 0, other.stderr
    other_id = int(other.stdout.strip())
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now() WHERE id = %s", [other_id])

    listed = run_cli(dsn, "jobs", "--state", "queued")
    assert listed.returncode == 0, listed.stderr
    row_cells = table_row(listed.stdout, str(job_id))
    assert row_cells[1:4] == ["default", "effect", "queued"]
    assert str(other_id) not in [cells[0] for cells in table_row_cells(listed.stdout)]

    status = run_cli(dsn, "status")
    assert status.returncode == 0, status.stderr
    header = table_row(status.stdout, "queue")
    assert header[1:] == ["queued", "running", "done", "failed", "cancelled", "blocked"]
    assert table_row(status.stdout, "default")[1:] == ["1", "0", "0", "0", "0", "0"]
    assert table_row(status.stdout, "other")[1:] == ["0", "0", "0", "1", "0", "0"]


# ---- the current directory: searched for --app only, and never ahead of installed modules -----------

SHADOWS = ("click", "rich", "wave")  # a third-party and a stdlib name a file in the cwd could shadow
LAUNCHERS = {"console-script": [str(Path(sys.executable).with_name("skiplock"))],
             "python-m": [sys.executable, "-m", "skiplock"]}


def _plain_env() -> dict[str, str]:
    """No PYTHONPATH: what the current directory contributes is up to skiplock (and Python)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONPATH"}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200")
    return env


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_current_directory_does_not_shadow_installed_modules(dsn, db, tmp_path, launcher):
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"import sys\nsys.stderr.write('SHADOWED {name}\\n')\n")
    (tmp_path / "mymod.py").write_text(textwrap.dedent("""
        import skiplock

        app = skiplock.App()

        @app.task(name="which_wave")
        def which_wave(job):
            import wave  # imported late, after --app: the stdlib's, not ./wave.py
            return wave.__file__
    """))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*LAUNCHERS[launcher], "--quiet", "--dsn", dsn, *args], cwd=tmp_path, env=_plain_env(),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert "SHADOWED" not in result.stdout + result.stderr, (args, result.stdout + result.stderr)
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        return result

    run("status")
    job_id = int(run("enqueue", "which_wave", "--app", "mymod:app").stdout.strip())  # ./mymod.py found
    run("worker", "--app", "mymod:app", "--concurrency", "1", "--stop-when-empty", "--no-maintenance")
    row = job_row(db, job_id)
    assert row["state"] == "done", row
    assert not row["result"].startswith(str(tmp_path)), row["result"]


def test_app_option_help_says_where_the_module_is_searched():
    result = subprocess.run([*LAUNCHERS["console-script"], "worker", "--help"], env=_plain_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "current directory" in " ".join(result.stdout.split())


# ---- bad input: one clear line, exit 2, nothing written -------------------------------------------


BAD_INPUT = {
    "not-json": (["enqueue", "effect", "--args", "not json"], "not valid JSON"),
    "not-an-object": (["enqueue", "effect", "--args", "[1,2]"], "JSON object"),
    "nan": (["enqueue", "effect", "--args", '{"x": NaN}'], "NaN"),
    "nul": (["enqueue", "effect", "--args", '{"x": "\\u0000"}'], "NUL"),
    "too-large": (["enqueue", "effect", "--app", "tasks_app:small_app", "--args",
                   json.dumps({"blob": "x" * (SMALL_ARGS_LIMIT + 1000)})], "limit"),
    "run-at-yesterday": (["enqueue", "effect", "--run-at", "yesterday"], "--run-at"),
    "unknown-task": (["enqueue", "no_such_task", "--app", "tasks_app:app"], "unknown task 'no_such_task'"),
    "worker-no-such-module": (["worker", "--app", "nosuchmodule:app", "--stop-when-empty"], "nosuchmodule"),
    "app-relative-module": (["enqueue", "effect", "--app", ".tasks_app:app"], "package.module:attr"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_clear_line_and_writes_nothing(dsn, db, case):
    argv, needle = BAD_INPUT[case]
    result = run_cli(dsn, *argv)
    line = assert_clean_failure(result, 2)
    assert needle in line, line
    assert jobs_count(db) == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.job_attempts") == 0


# Bad input that once escaped the checks (the reasons say how): each is one clear line, exit 2, nothing
# written, and whatever is stored stays listable.
BAD_INPUT_BUGS = {
    "lone-surrogate": (["enqueue", "effect", "--args", '{"x": "\\ud800"}'],
                       "was: app.serialise_args lets a lone UTF-16 surrogate through; PostgreSQL's jsonb rejects "
                       "it and the CLI dies with a psycopg InvalidTextRepresentation traceback (exit 1)"),
    "deeply-nested-args": (["enqueue", "effect", "--args", '{"x": ' + "[" * 5000 + "]" * 5000 + "}"],
                           "was: cli.enqueue catches only JSONDecodeError around json.loads; deep nesting raises "
                           "RecursionError and the CLI dies with a traceback (exit 1)"),
    "huge-delay": (["enqueue", "effect", "--delay", "1e300"],
                   "was: app._new_job checks delay is finite but not that now()+delay is representable; "
                   "timedelta(seconds=1e300) raises OverflowError, a traceback (exit 1)"),
    "run-at-before-year-1-utc": (["enqueue", "effect", "--run-at", "0001-01-01T00:00:00+14:00"],
                                 "was: app._check_run_at accepts a time that is BC in UTC; PostgreSQL stores it, "
                                 "psycopg cannot load it back, and every worker's claim then fails on that row "
                                 "forever (the whole queue is wedged; --stop-when-empty never exits)"),
    "run-at-after-year-9999-utc": (["enqueue", "effect", "--run-at", "9999-12-31T23:59:59-14:00"],
                                   "was: app._check_run_at accepts a time past year 9999 in UTC; it is stored, and "
                                   "`skiplock jobs` then dies with a psycopg DataError traceback"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT_BUGS))
def test_bad_input_escaping_the_checks(dsn, db, case):
    argv, _ = BAD_INPUT_BUGS[case]
    result = run_cli(dsn, *argv)
    try:
        assert_clean_failure(result, 2)
        assert jobs_count(db) == 0
    finally:
        listing = run_cli(dsn, "jobs")  # whatever was stored must still be listable
        assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr


def test_two_megabyte_args_are_refused_before_anything_is_written(dsn, db):
    # A 2 MB argument cannot reach the CLI at all (one argv string is capped at 128 KiB by the kernel),
    # so the default 1 MiB limit is checked through the API on the same real database.
    app = skiplock.App(dsn)
    try:
        with pytest.raises(skiplock.InvalidJob, match="limit is 1,048,576"):
            app.enqueue("effect", {"blob": "x" * (2 << 20)})
    finally:
        app.close()
    assert jobs_count(db) == 0


# ---- unreachable server ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["enqueue", "effect"], ["worker", "--app", "tasks_app:app"]],
                         ids=["status", "enqueue", "worker"])
def test_unreachable_database_exits_3_with_a_clear_message(command):
    result = run_cli(UNREACHABLE, *command)  # the subprocess timeout is only a safety net
    line = assert_clean_failure(result, 3)
    assert "cannot connect" in line and "127.0.0.1" in line, line


# ---- hostile names are data -----------------------------------------------------------------------


def test_hostile_queue_name_is_stored_and_claimed_as_data(dsn, effects):
    db = effects
    hostile = "q'; DROP TABLE skiplock.jobs; --\""
    enq = run_cli(dsn, "enqueue", "effect", "--queue", hostile)
    assert enq.returncode == 0, enq.stderr
    job_id = int(enq.stdout.strip())
    bystander = int(run_cli(dsn, "enqueue", "effect").stdout.strip())  # queue 'default': not served below
    assert job_row(db, job_id)["queue"] == hostile

    work = run_cli(dsn, "worker", "--app", "tasks_app:app", "--queues", hostile, "--concurrency", "1",
                   "--poll-interval", "0.05", "--stop-when-empty")
    assert work.returncode == 0, work.stderr
    assert "Traceback" not in work.stderr, work.stderr

    assert scalar(db, "SELECT to_regclass('skiplock.jobs') IS NOT NULL")
    job = job_row(db, job_id)
    assert (job["state"], job["queue"]) == ("done", hostile)
    assert len(effects_of(db, job_id)) == 1
    assert job_row(db, bystander)["state"] == "queued"

    listed = run_cli(dsn, "jobs", "--queue", hostile)
    assert listed.returncode == 0, listed.stderr
    assert [r[0] for r in table_row_cells(listed.stdout) if r[0].isdigit()] == [str(job_id)]


def test_names_that_look_like_markup_are_printed_as_they_are(dsn, db):
    """rich reads "[...]" as markup: data (queue and task names, errors) must be printed as text."""
    name = "[/bold] [red]q"
    job_id = int(run_cli(dsn, "enqueue", "no.such[/x]", "--queue", name).stdout.strip())
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now(), last_error = '[/oops] boom' "
               "WHERE id = %s", [job_id])
    for command in (["status"], ["queues"], ["jobs"], ["jobs", str(job_id)], ["jobs", "--queue", name]):
        result = run_cli(dsn, *command)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (command, result.stderr)
        assert name in result.stdout, (command, result.stdout)
    assert "[/oops] boom" in run_cli(dsn, "jobs").stdout
    line = assert_clean_failure(run_cli(dsn, "pause", "[/never]"), 2)
    assert "[/never]" in line, line


# ---- lifecycle commands -----------------------------------------------------------------------------


def test_lifecycle_commands(dsn, db, producer):
    failed = producer.enqueue("no.such.task")
    queued = producer.enqueue("effect", queue="mail")
    worker = run_cli(dsn, "worker", "--app", "tasks_app:app", "--queues", "default", "--stop-when-empty",
                     "--no-maintenance", "--fail-unknown-tasks")
    assert worker.returncode == 0, worker.stderr

    listing = run_cli(dsn, "queues")
    assert listing.returncode == 0 and "mail" in listing.stdout and "default" in listing.stdout

    assert run_cli(dsn, "pause", "mail").returncode == 0
    assert "paused" in run_cli(dsn, "queues").stdout
    bad = run_cli(dsn, "pause", "never-used")
    assert bad.returncode == 2 and "unknown queue" in bad.stderr and "Traceback" not in bad.stderr
    assert run_cli(dsn, "pause", "never-used", "--force").returncode == 0
    assert "resumed" in run_cli(dsn, "resume", "mail").stdout
    assert "was not paused" in run_cli(dsn, "resume", "mail").stdout

    cancelled = run_cli(dsn, "cancel", str(queued))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    assert scalar(db, "SELECT state FROM skiplock.jobs WHERE id = %s", [queued]) == "cancelled"

    retried = run_cli(dsn, "retry", "--failed")
    assert retried.returncode == 0 and "1 failed job(s) queued again" in retried.stdout
    assert scalar(db, "SELECT state FROM skiplock.jobs WHERE id = %s", [failed]) == "queued"
    wrong = run_cli(dsn, "retry", str(failed))
    assert wrong.returncode == 2 and "only failed or cancelled" in wrong.stderr
    assert run_cli(dsn, "retry").returncode == 2

    unique = [run_cli(dsn, "enqueue", "effect", "--unique-key", "k1").stdout.strip() for _ in range(2)]
    assert unique[0] == unique[1]

    db.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '30 days' WHERE id = %s", [queued])
    pruned = run_cli(dsn, "prune", "--cancelled", "1d")
    assert pruned.returncode == 0 and "1 cancelled" in pruned.stdout
    assert run_cli(dsn, "prune", "--done", "soon").returncode == 2

    waited = run_cli(dsn, "wait", unique[0], "--timeout", "0.2")
    assert waited.returncode == 1 and "did not finish" in waited.stderr


def test_retry_of_jobs_whose_unique_key_is_held(dsn, db, producer):
    held, free = producer.enqueue("effect", unique_key="k1"), producer.enqueue("effect", unique_key="k2")
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now() WHERE id = ANY(%s)", [[held, free]])
    holder = producer.enqueue("effect", unique_key="k1")

    one = run_cli(dsn, "retry", str(held))
    line = assert_clean_failure(one, 1)
    assert f"job {held}" in line and f"job {holder} holds its unique_key 'k1'" in line, line

    every = run_cli(dsn, "retry", "--failed")
    line = assert_clean_failure(every, 1)
    assert f"job {held} cannot be retried" in line and f"job {holder} holds" in line, line
    assert "1 failed job(s) queued again" in every.stdout
    assert scalar(db, "SELECT state FROM skiplock.jobs WHERE id = %s", [free]) == "queued"
    assert scalar(db, "SELECT state FROM skiplock.jobs WHERE id = %s", [held]) == "failed"


def test_demo_kills_a_worker_mid_run_and_every_effect_is_there_once(pg_admin_dsn):
    """`skiplock demo` (the README's main command), smaller: its own checks decide the exit code."""
    result = run_cli(pg_admin_dsn, "demo", "--jobs", "3000", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every job done, every database-local effect exactly once" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "│" in line]
    assert rows and all(line.rstrip().endswith("│ yes │") for line in rows if "│ NO" in line or "│ yes" in line)
    killed = [line for line in rows if re.search(r"killed worker \d+: jobs in flight", line)]
    assert len(killed) == 1 and "yes" in killed[0], killed


@pytest.mark.parametrize("dsn, code, expected", [
    ("sqlite://shop:Hunter2-secret@db.example/shop", 2, "unsupported DSN scheme 'sqlite'"),
    # the MySQL backend exists (issue 12): an unreachable server is "database unavailable", exit 3
    ("mysql://shop:Hunter2-secret@db.example:3306/shop", 3, "Can't connect to MySQL server"),
])
def test_a_dsn_of_another_database_is_one_line_without_its_password(dsn, code, expected):
    """open_backend picks the backend from the DSN's scheme: another scheme is refused naming the
    supported ones (exit 2); a MySQL DSN goes to the MySQL backend, whose unreachable server is a
    clear DatabaseUnavailable (exit 3) -- one line, no password, no traceback, either way."""
    for command in (("status",), ("enqueue", "effect"), ("migrate",)):
        result = run_cli(dsn, *command)
        assert result.returncode == code, (command, result)
        assert expected in result.stderr, result.stderr
        if code == 2:
            assert "postgresql://" in result.stderr, result.stderr
        assert "Hunter2-secret" not in result.stderr + result.stdout and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
