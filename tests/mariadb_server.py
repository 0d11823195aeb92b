"""A private MariaDB server for the tests (issue 12): the distribution's ``mariadb-server`` (10.11),
started by the test set-up itself -- never the system service.

- **Installed when missing**: as root, ``apt-get install -y mariadb-server``; otherwise the fixture
  skips saying exactly what to install (and in CI, ``CI`` set, a skip fails the run: tests/conftest.py).
- **Private**: its own data directory (``mariadb-install-db`` into a fresh temporary directory), its own
  Unix socket there, a free TCP port on 127.0.0.1 only, ``--no-defaults`` (no system my.cnf). As root
  it runs as the OS user ``skiplock_mariadb`` (created if missing, as the embedded PostgreSQL's
  ``embedded_postgres``); its directory is 0700, owned by that user: no other user reads its files or
  reaches its socket. ``root`` authenticates by ``unix_socket`` only; the tests connect over TCP as
  ``skiplock`` with a random password made here.
- **Fast**: no test database, no binary log, a small buffer pool, no fsync per commit (a test server:
  durability across an OS crash is not what is tested; a server crash/restart still keeps commits).
- **Stopped** at the end of the session (SIGTERM, then SIGKILL after a deadline) and its files removed.
"""

from __future__ import annotations

import itertools
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest

from private_servers import apt_install, binary, free_port, server_user

SERVER_USER_WHEN_ROOT = "skiplock_mariadb"
PACKAGE = "mariadb-server"
INSTALL_HINT = (f"the MariaDB tests need MariaDB 10.11's server (mariadbd, mariadb-install-db): "
                f"install it with `sudo apt-get install -y {PACKAGE}` (Debian/Ubuntu), "
                "or run the tests as root, which installs it")
TEST_USER = "skiplock"
_counter = itertools.count()


def ensure_installed() -> tuple[str, str]:
    """(mariadbd, mariadb-install-db); installs the package as root when missing, else skips saying
    what to install."""
    def present() -> tuple[str, str] | None:
        server, install_db = binary("mariadbd"), binary("mariadb-install-db")
        return (server, install_db) if server and install_db else None
    return apt_install(PACKAGE, INSTALL_HINT, present)


@dataclass
class MariaDB:
    """A running private server: ``admin_dsn`` (``mysql://skiplock:…@127.0.0.1:port/``, all privileges,
    KILL included), ``socket``, ``port``, ``version``."""

    root: Path
    process: subprocess.Popen[bytes]
    port: int
    socket: Path
    password: str
    version: str
    argv: tuple[str, ...] = ()  # the server's command line, for restart()

    def halt(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """Stop the server and keep its files (for :meth:`resume`): ``fast`` is a clean shutdown
        (SIGTERM), ``immediate`` a crash (SIGKILL: InnoDB recovers from its redo log on start)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM if mode == "fast" else signal.SIGKILL)
            self.process.wait(timeout)

    def resume(self, timeout: float = 60.0) -> None:
        """Start the halted server again, same data directory, port and socket; returns once the test
        user can connect."""
        self.process = subprocess.Popen(list(self.argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {self.process.returncode} on restart")
            try:
                with self.connect(connect_timeout=2):
                    return
            except Exception:  # noqa: BLE001 - not accepting yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def restart(self, mode: str = "fast") -> None:
        self.halt(mode)
        self.resume()

    @property
    def admin_dsn(self) -> str:
        return f"mysql://{TEST_USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/"

    def dsn(self, database: str) -> str:
        return f"mysql://{TEST_USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str | None = None, **kw: object):  # type: ignore[no-untyped-def]
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user=TEST_USER, password=self.password,
                               database=database, autocommit=True, **kw)  # type: ignore[arg-type]

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


# Seconds before each bootstrap try.
BOOTSTRAP_PAUSES = (0.0, 1.0, 3.0, 6.0)


def _owners(user: "pwd.struct_passwd", *paths: Path) -> str:
    """Who the server runs as and who owns its directories: what a "Permission denied" needs."""
    lines = [f"server user {user.pw_name}: uid {user.pw_uid}, gid {user.pw_gid} (now: {_uid_now(user.pw_name)})"]
    for path in paths:
        try:
            st = path.stat()
            lines.append(f"{path}: uid {st.st_uid}, gid {st.st_gid}, mode {st.st_mode & 0o7777:o}")
        except OSError as exc:
            lines.append(f"{path}: {exc.strerror}")
    return "\n".join(lines)


def _uid_now(name: str) -> str:
    try:
        return str(pwd.getpwnam(name).pw_uid)
    except KeyError:
        return "no such user"


def start(timeout: float = 60.0, extra_args: list[str] | None = None) -> MariaDB:
    """Install (if needed), initialise and start a private server; returns once it accepts the test user."""
    server, install_db = ensure_installed()
    user = server_user(SERVER_USER_WHEN_ROOT)
    root = Path(tempfile.mkdtemp(prefix="skiplock-mariadb-"))  # 0700, ours
    home = root / "server"  # the server's own files: 0700, its user's
    home.mkdir(mode=0o700)
    os.chown(home, user.pw_uid, user.pw_gid)
    if os.geteuid() == 0:
        os.chmod(root, 0o711)  # the server's user may pass through, not list
    data, sock = home / "data", home / "mysqld.sock"
    # Its own temporary directory: at start-up every mariadbd (the bootstrap of mariadb-install-db too)
    # deletes the #sql* files it finds in its tmpdir -- with the default /tmp, the live temporary tables
    # of the other private servers (pytest -n 3: "Unknown table 'mysql.tmp_user_sys'").
    tmp = home / "tmp"
    tmp.mkdir(mode=0o700)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    password = secrets.token_urlsafe(24)
    failures: list[str] = []
    # A bootstrap that failed gets more tries, after a pause: seen once in a CI run right after boot,
    # and on a fresh machine right after the test set-up installed the package (every bootstrap of the
    # test processes, for a few seconds: "Permission denied" in its own data directory).
    for pause in BOOTSTRAP_PAUSES:
        time.sleep(pause)
        done = subprocess.run([install_db, "--no-defaults", f"--datadir={data}", f"--tmpdir={tmp}",
                               f"--user={user.pw_name}", "--auth-root-authentication-method=socket", "--skip-test-db",
                               "--skip-name-resolve"], capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0:
            break
        # what the bootstrap said, with the server's own log lines if it left any in the data directory
        logs = "".join(f.read_text(errors="replace")[-1500:] for f in data.glob("*.err")) if data.exists() else ""
        failures.append(f"exit {done.returncode}: {done.stdout[-1500:]}\n{done.stderr[-1500:]}\n{logs}\n"
                        f"{_owners(user, root, home, tmp, data)}")
        shutil.rmtree(data, ignore_errors=True)
    else:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"mariadb-install-db failed {len(failures)} times:\n" + "\n---\n".join(failures))
    if failures:
        warnings.warn(f"mariadb-install-db failed {len(failures)} time(s), then worked: {failures[0][:2000]}",
                      stacklevel=1)
    port = free_port()
    log = home / "error.log"
    argv = (
        server, "--no-defaults", f"--datadir={data}", f"--tmpdir={tmp}", f"--socket={sock}", f"--port={port}",
         "--bind-address=127.0.0.1", f"--user={user.pw_name}", f"--pid-file={home / 'mysqld.pid'}",
         f"--log-error={log}", "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=128M",
         "--innodb-flush-log-at-trx-commit=2", "--max-connections=500", "--character-set-server=utf8mb4",
         "--collation-server=utf8mb4_bin", *(extra_args or []))
    process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    db = MariaDB(root, process, port, sock, password, "", argv)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"mariadbd exited with {process.returncode}: {text}")
        if sock.exists():
            # root (or the installing user) authenticates by unix_socket on the private socket; the
            # test user's password goes through stdin, never argv
            client = binary("mariadb") or "mariadb"
            done = subprocess.run([client, "--no-defaults", f"--socket={sock}", "-u",
                                   "root" if os.geteuid() == 0 else user.pw_name],
                                  input=(f"CREATE USER '{TEST_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
                                         f"GRANT ALL PRIVILEGES ON *.* TO '{TEST_USER}'@'127.0.0.1' "
                                         "WITH GRANT OPTION;\n"),
                                  capture_output=True, text=True, timeout=timeout)
            if done.returncode == 0:
                with db.connect() as c, c.cursor() as cur:
                    cur.execute("SELECT VERSION()")
                    db.version = str(cur.fetchone()[0])
                return db
        if time.monotonic() > deadline:
            db.stop()
            raise RuntimeError("the private MariaDB did not start in time")
        time.sleep(0.05)


def fresh_database(db: MariaDB) -> str:
    name = f"skiplock_t{os.getpid()}_{next(_counter)}"
    with db.connect() as c, c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")  # name made above: [a-z0-9_] only
        cur.execute(f"CREATE DATABASE `{name}`")
    return name


def drop_database(db: MariaDB, name: str) -> None:
    """Drop it, ending its sessions first (as PostgreSQL's DROP DATABASE … WITH (FORCE)): an open
    transaction's metadata locks would make the DROP wait."""
    with db.connect() as c, c.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()", (name,))
        for (sid,) in cur.fetchall():
            try:
                cur.execute("KILL CONNECTION %s", (sid,))
            except Exception:  # noqa: BLE001 - gone meanwhile (1094)
                pass
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDB]:
    """The session's private MariaDB (started on first use, stopped at the end)."""
    db = start()
    try:
        yield db
    finally:
        db.stop()


@pytest.fixture(scope="session")
def mariadb_admin_dsn(mariadb_server: MariaDB) -> str:
    """A DSN with every privilege (KILL of other sessions, CREATE DATABASE) on the private server."""
    return mariadb_server.admin_dsn


@pytest.fixture
def mariadb_dsn(mariadb_server: MariaDB) -> Iterator[str]:
    """``mysql://…`` naming a fresh, empty database (dropped after the test)."""
    name = fresh_database(mariadb_server)
    yield mariadb_server.dsn(name)
    drop_database(mariadb_server, name)
