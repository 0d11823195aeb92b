"""``--app`` from a person's point of view: ``skiplock enqueue`` applies what the app registers (also
through SKIPLOCK_APP) and refuses what its handler cannot take; without an app it says what it could
not do; an AsyncApp works; a typo or a broken module is explained in the user's terms."""

from __future__ import annotations

import json
import textwrap

import pytest
from cli_support import ok, one_error_line, run



def job(db, job_id):
    return db.execute("SELECT task, queue, priority, max_attempts, args FROM skiplock.jobs WHERE id = %s",
                      [job_id]).fetchone()


def test_enqueue_applies_the_tasks_registered_options_from_skiplock_app(dsn, db):
    result = ok(run(dsn, "enqueue", "mail.send", "--args", '{"to": "a@x"}', env={"SKIPLOCK_APP": "cli_tasks:app"}))
    assert job(db, int(result.stdout)) == ("mail.send", "mail", 3, 2, {"to": "a@x"})
    assert "warning" not in result.stderr, result.stderr


def test_enqueue_without_an_app_warns_that_registered_options_are_not_applied(dsn, db):
    result = ok(run(dsn, "enqueue", "mail.send", "--args", '{"to": "a@x"}'))
    assert job(db, int(result.stdout))[1:3] == ("default", 0)  # what the app would have set is not known here
    (line,) = result.stderr.splitlines()
    assert line.startswith("warning: ") and "--app" in line and "SKIPLOCK_APP" in line and "not applied" in line, line


@pytest.mark.parametrize("args, needle", [
    ({}, "missing a required argument: 'to'"),
    ({"to": "a@x", "bcc": "b@x"}, "unexpected keyword argument 'bcc'"),
], ids=["missing", "unexpected"])
def test_enqueue_refuses_args_the_handler_cannot_take(dsn, db, args, needle):
    line = one_error_line(run(dsn, "enqueue", "mail.send", "--app", "cli_tasks:app", "--args", json.dumps(args)))
    assert "mail.send" in line and needle in line and "to: str" in line, line
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone() == (0,)


def test_enqueue_refuses_an_unknown_task_named_through_skiplock_app(dsn, db):
    line = one_error_line(run(dsn, "enqueue", "mail.sned", env={"SKIPLOCK_APP": "cli_tasks:app"}))
    assert "unknown task 'mail.sned'" in line, line
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone() == (0,)


def test_app_naming_an_async_app_works(dsn, db):
    job_id = int(ok(run(dsn, "enqueue", "async.ping", "--app", "cli_tasks:aapp", "--args", '{"n": 7}')).stdout)
    ok(run(dsn, "worker", "--app", "cli_tasks:aapp", "--concurrency", "1", "--stop-when-empty", "--no-maintenance"))
    assert db.execute("SELECT state, result FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone() == ("done", 7)


def test_a_typo_in_the_attribute_says_what_the_module_contains(dsn):
    line = one_error_line(run(dsn, "worker", "--app", "cli_tasks:ap"))
    assert "'cli_tasks' has no attribute 'ap'" in line and "did you mean 'app'?" in line, line
    assert "app (App)" in line and "aapp (AsyncApp)" in line, line


def test_a_module_that_fails_to_import_shows_the_users_traceback(dsn, tmp_path):
    (tmp_path / "broken_tasks.py").write_text(textwrap.dedent("""
        import skiplock

        app = skiplock.App()

        def load_settings():
            return {}["SMTP_HOST"]

        SETTINGS = load_settings()
    """))
    result = run(dsn, "worker", "--app", "broken_tasks:app", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2, result
    err = result.stderr
    first = err.splitlines()[0]
    assert first.startswith("error: importing 'broken_tasks' for --app failed: KeyError"), err
    assert "broken_tasks.py\", line 9, in <module>" in err and "line 7, in load_settings" in err, err
    assert err.rstrip().endswith("KeyError: 'SMTP_HOST'"), err
    frames = [line for line in err.splitlines() if line.strip().startswith("File ")]
    assert len(frames) == 2 and all("broken_tasks.py" in f for f in frames), err  # the user's frames only


def test_a_missing_module_is_still_one_line(dsn):
    line = one_error_line(run(dsn, "enqueue", "x", "--app", "no_such_module_here:app"))
    assert "no_such_module_here" in line, line



