"""The embedded default: no DSN starts (or reuses) a real PostgreSQL, as root and as a normal user."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def python_for_nobody() -> list[str]:
    """Our interpreter if `nobody` may run it, else the system's of the same version given our sys.path
    (a venv made from an interpreter under /root, as pyenv's, is not executable by other users)."""
    probe = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", f"test -x {shlex.quote(sys.executable)}"])
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if probe.returncode == 0 or not system.exists():
        return [sys.executable]
    path = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    return [f"PYTHONPATH={shlex.quote(path)}", str(system)]


def nobody_can_run(python: list[str]) -> str | None:
    """None if `nobody` can start ``python`` and import skiplock with it, else why not (its error)."""
    command = " ".join([*python, "-c", shlex.quote("import skiplock.cli")])
    probe = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", command], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]


def require_an_interpreter_for_nobody() -> None:
    """Skip, saying why, when the OS user `nobody` cannot run this interpreter with skiplock (e.g. a
    Python under a private home directory and no system Python of the same version): the test then
    cannot run the command line as another user, which is not a failure of skiplock."""
    if os.geteuid() != 0:
        return
    python = python_for_nobody()
    why = nobody_can_run(python)
    if why is not None:
        pytest.skip(f"the OS user 'nobody' cannot run {' '.join(python)} with skiplock importable ({why}); "
                    "install skiplock in a virtualenv made from an interpreter other users may execute "
                    "(e.g. /usr/bin/python3) to run this test")


def run_as_unprivileged(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI as an ordinary user: `nobody` when the tests run as root, else ourselves."""
    env = f"HOME={shlex.quote(str(home))} PYTHONUNBUFFERED=1"  # su starts a clean environment: no SKIPLOCK_DSN
    python = python_for_nobody() if os.geteuid() == 0 else [shlex.quote(sys.executable)]
    command = " ".join(["env -u SKIPLOCK_DSN", env, *python, "-m", "skiplock", *map(shlex.quote, args)])
    if os.geteuid() == 0:
        argv = ["su", "nobody", "-s", "/bin/sh", "-c", command]
    else:
        argv = ["/bin/sh", "-c", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


def test_embedded_server_starts_and_is_reused_by_a_normal_user():
    require_an_interpreter_for_nobody()
    home = Path(tempfile.mkdtemp(prefix="skiplock-user-"))  # pytest's tmp dirs are private to root
    home.chmod(0o777)
    data = home / "pg"
    try:
        first = run_as_unprivileged(["--data-dir", str(data), "migrate"], home)
        assert first.returncode == 0, first.stderr
        assert f"embedded PostgreSQL in {data}" in first.stderr  # it says where it is
        pid = (data / "postmaster.pid").read_text().splitlines()[0]
        enq = run_as_unprivileged(["--data-dir", str(data), "enqueue", "t", "--args", '{"n": 1}'], home)
        assert enq.returncode == 0 and enq.stdout.strip().isdigit(), enq.stderr
        assert (data / "postmaster.pid").read_text().splitlines()[0] == pid  # reused, not restarted
        owner = data.stat().st_uid
        assert owner != 0  # PostgreSQL never runs as root
        passfile = data / "skiplock.pgpass"  # the password its DSN names: the user's own, private
        assert passfile.stat().st_uid == owner and passfile.stat().st_mode & 0o777 == 0o600
    finally:
        stop = run_as_unprivileged(["--data-dir", str(data), "server", "stop"], home)
        shutil.rmtree(home, ignore_errors=True)
        assert stop.returncode == 0, stop.stderr


def test_embedded_server_as_the_current_user_via_the_api():
    import skiplock

    # Not pytest's tmp_path: as root the server runs as another OS user, which must traverse the data
    # directory's parents, and any pytest session that starts on the machine resets the mode of
    # /tmp/pytest-of-<user> to 0700 (so would another user's cleaner); a directory of its own is ours.
    base = Path(tempfile.mkdtemp(prefix="skiplock-api-"))
    app = skiplock.App(data_dir=base / "pg")
    try:
        app.migrate()
        job_id = app.enqueue("t", {"n": 1})
        assert app.get_job(job_id).state == "queued"
        assert app.embedded_server is not None and app.embedded_server.data_dir == (base / "pg").resolve()
    finally:
        app.close()
        from skiplock.backend.postgres import embedded

        embedded.stop_server(base / "pg")
        shutil.rmtree(base, ignore_errors=True)
