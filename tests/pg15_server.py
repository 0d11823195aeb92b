"""A private PostgreSQL 15 server for the tests (issue 15 item 5): the distribution's ``postgresql-15``
(/usr/lib/postgresql/15/bin), started by the test set-up itself -- never the system service.

- **Installed when missing**: as root, ``apt-get install -y postgresql-15``; otherwise the fixture
  skips saying what to install (and in CI, ``CI`` set, a skip fails the run: tests/conftest.py).
- **Private**: its own data directory (initdb into a fresh temporary directory, 0700), its own Unix
  socket directory (0700), a free TCP port on 127.0.0.1 only. As root it runs as the OS user
  ``skiplock_pg15`` (created if missing); every connection needs a password (scram-sha-256, a random
  one made here, kept in a 0600 passfile that the DSN names -- never in a DSN or an argv).
- **Fast**: ``fsync=off`` (a test server: durability across an OS crash is not what is tested; a
  server crash/restart still keeps commits).
- **Stopped** at the end of the session (``pg_ctl stop -m immediate``) and its files removed.
"""

from __future__ import annotations

import itertools
import os
import pwd
import uuid
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from psycopg import conninfo, sql

from private_servers import apt_install, free_port, private_file, server_user

BIN = Path("/usr/lib/postgresql/15/bin")
PACKAGE = "postgresql-15"
SERVER_USER_WHEN_ROOT = "skiplock_pg15"
SUPERUSER = "postgres"
INSTALL_HINT = (f"the PostgreSQL 15 tests need the distribution's server ({BIN}): install it with "
                f"`sudo apt-get install -y {PACKAGE}` (Debian/Ubuntu), or run the tests as root, which installs it")
SETTINGS = """
max_connections = 200
shared_buffers = 64MB
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
autovacuum_naptime = 1s
password_encryption = scram-sha-256
"""


def ensure_installed() -> Path:
    return apt_install(PACKAGE, INSTALL_HINT,
                       lambda: BIN if (BIN / "postgres").exists() and (BIN / "initdb").exists() else None)


def _as(user: pwd.struct_passwd) -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


@dataclass
class Postgres15:
    """A running private server: ``admin_dsn`` (its superuser, over TCP 127.0.0.1 with the passfile),
    ``version_num`` (``server_version_num``)."""

    root: Path
    data: Path
    port: int
    passfile: Path
    version_num: int = 0

    @property
    def admin_dsn(self) -> str:
        return conninfo.make_conninfo(host="127.0.0.1", port=str(self.port), user=SUPERUSER, dbname="postgres",
                                      passfile=str(self.passfile))

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([str(BIN / "pg_ctl"), "-D", str(self.data), *args], check=True, capture_output=True,
                       timeout=timeout, cwd="/", **_as(server_user(SERVER_USER_WHEN_ROOT)))  # type: ignore[call-overload]

    def stop(self) -> None:
        try:
            self.pg_ctl("-m", "immediate", "-w", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def start(timeout: float = 60.0) -> Postgres15:
    """initdb and start a private server; returns once the superuser can connect."""
    ensure_installed()
    user = server_user(SERVER_USER_WHEN_ROOT)
    root = Path(tempfile.mkdtemp(prefix="skiplock-pg15-"))  # 0700, ours
    home = root / "server"
    home.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(home, user.pw_uid, user.pw_gid)
        os.chmod(root, 0o711)  # the server's user may pass through, not list
    data, sockets = home / "data", home / "sockets"
    sockets.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(sockets, user.pw_uid, user.pw_gid)
    password = secrets.token_urlsafe(24)
    private_file(home / "pw", password + "\n", user)
    run = dict(capture_output=True, text=True, timeout=timeout, cwd="/", **_as(user))
    done = subprocess.run([str(BIN / "initdb"), "-D", str(data), "--auth=scram-sha-256", f"--pwfile={home / 'pw'}",
                           "-U", SUPERUSER, "--encoding=UTF8", "--locale=C", "--no-sync"], **run)  # type: ignore[call-overload]
    (home / "pw").unlink()
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb (PostgreSQL 15) failed: {done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    port = free_port()
    with (data / "postgresql.conf").open("a") as f:
        f.write(SETTINGS + f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{sockets}'\n")
    passfile = root / "passfile"  # the tests' (root's) copy, 0600
    private_file(passfile, f"*:*:*:{SUPERUSER}:{password}\n", pwd.getpwuid(os.geteuid()))
    server = Postgres15(root, data, port, passfile)
    done = subprocess.run([str(BIN / "pg_ctl"), "-D", str(data), "-w", "-t", str(int(timeout)), "-l",
                           str(home / "server.log"), "start"], **run)  # type: ignore[call-overload]
    if done.returncode != 0:
        log = (home / "server.log").read_text(errors="replace")[-2000:] if (home / "server.log").exists() else ""
        server.stop()
        raise RuntimeError(f"PostgreSQL 15 did not start: {done.stderr[-1000:]}\n{log}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(server.admin_dsn, connect_timeout=5) as c:
                server.version_num = int(c.info.server_version)
            return server
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.05)


_counter = itertools.count()


def _create_db(admin: str, name: str, template: str | None = None) -> None:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if template:
            c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _drop_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg15_server() -> Iterator[Postgres15]:
    """The session's private PostgreSQL 15 (started on first use, stopped at the end)."""
    server = start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg15_admin_dsn(pg15_server: Postgres15) -> str:
    """The PostgreSQL 15 superuser's DSN (TCP 127.0.0.1, password from a 0600 passfile)."""
    return pg15_server.admin_dsn


@pytest.fixture(scope="session")
def pg15_template_db(pg15_admin_dsn: str) -> str:
    """A database on PostgreSQL 15 with skiplock's schema installed, cloned for every test."""
    import skiplock

    name = f"skiplock_tpl15_{uuid.uuid4().hex[:8]}"
    _create_db(pg15_admin_dsn, name)
    app = skiplock.App(conninfo.make_conninfo(pg15_admin_dsn, dbname=name))
    app.migrate()
    app.close()
    return name  # dropped with the server


@pytest.fixture
def pg15_dsn(pg15_admin_dsn: str, pg15_template_db: str) -> Iterator[str]:
    """A fresh database on PostgreSQL 15 with the skiplock schema installed (dropped after the test)."""
    name = f"skiplock_t15_{os.getpid()}_{next(_counter)}"
    _create_db(pg15_admin_dsn, name, pg15_template_db)
    yield conninfo.make_conninfo(pg15_admin_dsn, dbname=name)
    _drop_db(pg15_admin_dsn, name)
