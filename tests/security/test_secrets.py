"""No DSN password on display: not in an error message, a log line, ``repr()``, the CLI's output, nor
in another process's command line (``/proc/PID/cmdline``) -- real processes, a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import psycopg
from psycopg import conninfo, sql

import skiplock
from skiplock import DatabaseUnavailable
from skiplock.errors import redact_dsn
from support import cli_env

SECRET = "known-secret-xyz"
HERE = Path(__file__).resolve().parent

# Failing DSNs carrying the password: unreachable (URI and key=value forms) and unparseable (libpq's
# own message then quotes the DSN it could not parse).
FAILING = {
    "uri-unreachable": f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=2",
    "kv-unreachable": f"host=127.0.0.1 port=1 dbname=x user=u password={SECRET} connect_timeout=2",
    "kv-quoted": f"host=127.0.0.1 port=1 user=u password='{SECRET} x' connect_timeout=2",
    "uri-bad-option": f"postgresql://u:{SECRET}@127.0.0.1:1/db?bogus=1",
    "uri-unparseable": f"postgresql://u:{SECRET}@[::1:1/db",
    "kv-unparseable": f"host=127.0.0.1 password={SECRET} port",
}


def run(argv: list[str], dsn: str, *, via_env: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = cli_env(HERE, **({"SKIPLOCK_DSN": dsn} if via_env else {}))
    dsn_args = [] if via_env else ["--dsn", dsn]
    return subprocess.run([sys.executable, "-m", "skiplock", "--quiet", *dsn_args, *argv], cwd=HERE, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


ROLE = "skiplock_secret_user"


def with_password(dsn: str) -> str:
    """``dsn`` as a role whose password is the known secret, given in the DSN itself (the embedded
    server checks passwords on every connection, so the secret is really used to log in)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
            c.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(ROLE),
                                                                                 sql.Literal(SECRET)))
    parts = conninfo.conninfo_to_dict(dsn)
    parts.pop("passfile", None)
    return conninfo.make_conninfo(**{**parts, "user": ROLE, "password": SECRET})


def test_a_wrong_password_is_refused_without_showing_it(dsn):
    right = with_password(dsn)
    wrong = conninfo.make_conninfo(right, password=SECRET + "-wrong")
    result = run(["status"], wrong, via_env=True)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "password authentication failed" in out, out
    assert SECRET not in out and "Traceback" not in out, out
    with pytest.raises(DatabaseUnavailable) as caught:
        skiplock.App(wrong).check()
    assert SECRET not in str(caught.value), caught.value


@pytest.mark.parametrize("name", list(FAILING))
def test_redact_dsn_drops_the_password(name):
    shown = redact_dsn(FAILING[name])
    assert SECRET not in shown, shown
    assert "127.0.0.1" in shown or "unparseable" in shown, shown


@pytest.mark.parametrize("name", list(FAILING))
def test_a_failing_connection_never_shows_the_password(name):
    dsn = FAILING[name]
    for via_env in (False, True):
        result = run(["status"], dsn, via_env=via_env)
        out = result.stdout + result.stderr
        assert result.returncode == 3, out
        assert "Traceback" not in out, out
        assert SECRET not in out, out
        assert "error:" in result.stderr
    for command, code in ((["scenario"], 1), (["demo", "--jobs", "10"], 3), (["migrate"], 3)):
        result = run(command, dsn, via_env=True)
        out = result.stdout + result.stderr
        assert result.returncode == code, (command, out)
        assert "Traceback" not in out, out
        assert SECRET not in out, (command, out)
    app = skiplock.App(dsn)
    with pytest.raises(DatabaseUnavailable) as caught:
        app.check()
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert SECRET not in repr(app) and SECRET not in repr(app.backend)
    app.close()


def test_repr_of_a_connected_app_and_backend_hide_the_password(dsn):
    app = skiplock.App(with_password(dsn))
    app.check()
    try:
        for shown in (repr(app), str(app), repr(app.backend), str(app.backend)):
            assert SECRET not in shown, shown
        assert "dbname=" in repr(app), repr(app)  # still says which database
    finally:
        app.close()


def test_worker_logs_carry_no_password(dsn):
    secret_dsn = with_password(dsn)
    result = run(["worker", "--app", "secrets_app:app", "--stop-when-empty", "--log-level", "DEBUG",
                  "--poll-interval", "0.05"], secret_dsn, via_env=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "worker" in out  # it did log
    assert SECRET not in out, out


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_demo_workers_get_the_dsn_without_argv(pg_admin_dsn, tmp_path):
    """`skiplock demo` with a password DSN: no process it starts has the password in its command line,
    and nothing it prints shows it."""
    secret_dsn = with_password(pg_admin_dsn)
    out_path, err_path = tmp_path / "demo.out", tmp_path / "demo.err"
    argv = [sys.executable, "-m", "skiplock", "--quiet", "demo", "--jobs", "2000", "--workers", "2"]
    cmdlines: set[tuple[int, bytes]] = set()  # every (pid, command line) seen
    with open(out_path, "w") as fo, open(err_path, "w") as fe:
        demo = subprocess.Popen(argv, cwd=HERE, env=cli_env(HERE, SKIPLOCK_DSN=secret_dsn),
                                stdin=subprocess.DEVNULL, stdout=fo, stderr=fe)
        try:
            deadline = time.monotonic() + 300  # safety net only
            while demo.poll() is None and time.monotonic() < deadline:
                for pid in [demo.pid, *_descendants(demo.pid)]:
                    try:
                        cmdlines.add((pid, Path(f"/proc/{pid}/cmdline").read_bytes()))
                    except OSError:
                        pass
                time.sleep(0.01)
        finally:
            if demo.poll() is None:
                demo.kill()
            demo.wait(timeout=30)
    output = out_path.read_text() + err_path.read_text()
    assert demo.returncode == 0, output[-3000:]
    workers = {pid for pid, c in cmdlines if pid != demo.pid and b"worker" in c}
    assert len(workers) >= 2, cmdlines  # the demo's worker processes were seen
    for pid, cmdline in cmdlines:
        assert SECRET.encode() not in cmdline, (pid, cmdline)
    assert SECRET not in output, output
