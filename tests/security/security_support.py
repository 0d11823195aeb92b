"""Helpers of the security tests: data directories, and commands run as another OS user."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from skiplock.backend.postgres import embedded

# A Unix socket path is limited to ~107 bytes: a data directory this deep gets its socket elsewhere.
LONG = "d" * 90


class Servers:
    def __init__(self, base: Path):
        self.base = base
        self.data_dirs: list[Path] = []
        self.socket_dirs: set[Path] = set()

    def data_dir(self, long: bool = False) -> Path:
        d = self.base / (LONG if long else "") / f"pg{len(self.data_dirs)}"
        d.parent.mkdir(parents=True, exist_ok=True)
        self.data_dirs.append(d)
        return d

    def start(self, data_dir: Path, **kwargs: object) -> embedded.EmbeddedServer:
        server = embedded.ensure_server(data_dir, **kwargs)
        self.socket_dirs.add(server.socket_dir)
        return server

    def cleanup(self) -> None:
        for d in self.data_dirs:
            try:
                embedded.stop_server(d, mode="immediate")
            except Exception:  # noqa: BLE001 - cleanup of a test that may have left anything behind
                pass
            embedded.remove_data_dir(d)
        for s in self.socket_dirs:
            if s.is_dir() and not s.is_symlink() and s != self.base and self.base not in s.parents:
                shutil.rmtree(s, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)


def old_predictable_socket_dir(data_dir: Path) -> Path:
    """Where skiplock up to 0.x put the socket of a long data-dir path: guessable by anyone."""
    return Path("/tmp") / f"skiplock-{hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]}"


def as_user(user: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as OS user ``user`` (its own uid and gid, no supplementary groups)."""
    base = {"PATH": "/usr/bin:/bin", "HOME": "/", "PGPASSFILE": "/nonexistent", "LC_ALL": "C"}
    return subprocess.run(argv, user=user, group=pwd.getpwnam(user).pw_gid, extra_groups=[], env={**base, **(env or {})}, cwd="/",
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def psql_as(user: str, conninfo: str, command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The embedded server's own psql, run as ``user``; never prompts for a password."""
    psql = str(embedded._bin_dir() / "psql")
    return as_user(user, [psql, "-X", "-w", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-c", command], env)


def copy_to_program(marker: Path) -> str:
    """The superuser's road to a shell: if this runs, the server's OS user has created ``marker``."""
    return f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'"


@lru_cache(maxsize=None)
def python_for(user: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(argv prefix, extra env) of a Python that ``user`` can run with this test run's packages
    importable: ours if they may execute it, else the system's of the same version, given our
    sys.path (a venv made from an interpreter under /root, as pyenv's, is not executable by others)."""
    try:
        probe = as_user(user, [sys.executable, "-c", "import skiplock"])
        if probe.returncode == 0:
            return (sys.executable,), ()
        why = probe.stderr.strip()
    except PermissionError as exc:  # the exec itself, refused
        why = str(exc)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    assert system.exists(), f"{user} cannot run {sys.executable} ({why}) and there is no {system}"
    return (str(system),), (("PYTHONPATH", os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())),)


def skiplock_as(user: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The skiplock CLI run as ``user``."""
    argv, extra = python_for(user)
    return as_user(user, [*argv, "-m", "skiplock", *args], {**dict(extra), **(env or {})})


def python_as(user: str, code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv, extra = python_for(user)
    return as_user(user, [*argv, "-c", code, *args], {**dict(extra), **(env or {})})
