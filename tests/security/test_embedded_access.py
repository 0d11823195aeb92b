"""Nobody but the owner may use the embedded server (issue 10, item 1).

The superuser can run shell commands as the server's OS user (``COPY ... TO PROGRAM``), so a server
any local user can log in to hands that user the owner's account. These tests attack a real embedded
server as another OS user, over TCP and over the Unix socket, and check the owner needs no setup.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

import skiplock
from skiplock.backend.postgres import embedded
from skiplock.errors import ConfigurationError
from security_support import copy_to_program, psql_as, python_as, skiplock_as



@pytest.fixture
def marker() -> Path:
    """Where a successful ``COPY ... TO PROGRAM`` would leave a file (any user may write there)."""
    d = Path(tempfile.mkdtemp(prefix="skl-marker-"))
    d.chmod(0o1777)
    yield d / "pwned"
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def without_password(dsn: str) -> str:
    """The DSN as another user would have it: no readable password file."""
    return conninfo.make_conninfo(dsn, passfile="/nonexistent")


def test_no_tcp_listener_by_default(servers):
    server = servers.start(servers.data_dir())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    assert not server.tcp


def test_another_user_cannot_connect_over_tcp(servers, intruder, marker, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_EMBEDDED_TCP", "1")  # TCP only when asked for
    server = servers.start(servers.data_dir())
    tcp = f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"
    no_password = psql_as(intruder, tcp, copy_to_program(marker))
    assert no_password.returncode != 0 and "no password supplied" in no_password.stderr, no_password
    guessed = psql_as(intruder, tcp, copy_to_program(marker), env={"PGPASSWORD": "postgres"})
    assert guessed.returncode != 0 and "password authentication failed" in guessed.stderr, guessed
    assert not marker.exists()
    with psycopg.connect(server.tcp_dsn) as c:  # the owner's TCP DSN works (with the password file)
        assert c.execute("SELECT inet_server_addr() IS NOT NULL").fetchone() == (True,)
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(without_password(server.tcp_dsn)).close()


@pytest.mark.parametrize("long_path", [False, True], ids=["socket-in-data-dir", "socket-dir-elsewhere"])
def test_another_user_cannot_reach_the_socket(servers, intruder, marker, long_path):
    server = servers.start(servers.data_dir(long=long_path))
    attempt = psql_as(intruder, f"host={server.socket_dir} port={server.port} user=postgres dbname=postgres",
                      copy_to_program(marker))
    assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, attempt
    assert not marker.exists()


def test_the_socket_needs_the_password_too(servers):
    """Even a client that reaches the socket (the owner, root) must prove it knows the password."""
    server = servers.start(servers.data_dir())
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(without_password(server.dsn)).close()


def test_the_owner_connects_with_no_setup_and_no_password_in_the_dsn(servers):
    data = servers.data_dir()
    app = skiplock.App(data_dir=data)
    try:
        app.migrate()
        job_id = app.enqueue("t", {"n": 1})
        server = app.embedded_server
    finally:
        app.close()
    password = (data / embedded.PASSFILE).read_text().strip().rsplit(":", 1)[1]
    assert len(password) >= 32
    for text in (server.dsn, server.tcp_dsn if server.tcp else "", repr(server)):
        assert password not in text
    assert conninfo.conninfo_to_dict(server.dsn)["passfile"] == str(data / embedded.PASSFILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    cli = subprocess.run([sys.executable, "-m", "skiplock", "--data-dir", str(data), "jobs", str(job_id)],
                         capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert cli.returncode == 0 and "queued" in cli.stdout, cli
    assert password not in cli.stdout + cli.stderr


def test_modes_of_the_data_dir_password_file_and_socket_dir(servers):
    server = servers.start(servers.data_dir(long=True))
    server_uid = os.stat(server.data_dir).st_uid
    passfile = server.data_dir / embedded.PASSFILE
    assert stat.S_IMODE(os.lstat(server.data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(passfile).st_mode) == 0o600 and os.lstat(passfile).st_uid == server_uid
    assert passfile.read_text().startswith("*:*:*:postgres:")
    st = os.lstat(server.socket_dir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == server_uid
    if os.geteuid() == 0:
        assert server_uid != 0  # PostgreSQL never runs as root


def test_tcp_is_a_setting_of_the_data_dir(servers):
    """Asking for TCP from a server running without it is a clear error, not a silent restart."""
    data = servers.data_dir()
    servers.start(data)
    with pytest.raises(ConfigurationError, match="without TCP.*server stop"):
        servers.start(data, tcp=True)
    embedded.stop_server(data)
    assert servers.start(data, tcp=True).tcp
    assert servers.start(data).tcp  # kept: a later start with no preference reuses it


# ---- a data directory made by an older skiplock (initdb --auth=trust, TCP on 127.0.0.1) ------------

OLD_SETTINGS = "\n# --- added by skiplock ---\nmax_connections = 300\nlisten_addresses = '127.0.0.1'\n"


def make_old_data_dir(data: Path) -> None:
    data.mkdir(mode=0o700)
    if os.geteuid() == 0:
        embedded._prepare_for_root(data)
    embedded._run_as_server_user([str(embedded._bin_dir() / "initdb"), "-D", str(data), "--auth=trust",
                                  "--encoding=UTF8", "--locale=C", "-U", "postgres"], timeout=180)
    with (data / "postgresql.conf").open("a") as f:
        f.write(OLD_SETTINGS)


def start_old_style(data: Path) -> str:
    """Start it as the old code did (-p PORT -k DATA_DIR) and return its (passwordless) DSN."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    embedded._run_as_server_user([str(embedded._bin_dir() / "pg_ctl"), "-D", str(data), "-w", "-l",
                                  str(data / "server.log"), "-o", f"-p {port} -k {data}", "start"], timeout=90)
    return f"host={data} port={port} user=postgres dbname=postgres"


def test_an_old_data_dir_is_secured_and_keeps_its_data(servers, intruder, marker):
    data = servers.data_dir()
    make_old_data_dir(data)
    old_dsn = start_old_style(data)
    with psycopg.connect(old_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE kept (v text)")
        c.execute("INSERT INTO kept VALUES ('from the old server')")
    # Running, it is refused (clients of the insecure server are not silently cut off) ...
    with pytest.raises(ConfigurationError, match="older skiplock.*server stop"):
        servers.start(data)
    assert embedded.stop_server(data)
    # ... stopped, the next start secures it.
    server = servers.start(data)
    with psycopg.connect(server.dsn) as c:
        assert c.execute("SELECT v FROM kept").fetchall() == [("from the old server",)]
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(without_password(server.dsn)).close()
    hba = [line.split() for line in (data / "pg_hba.conf").read_text().splitlines()]
    assert not [f for f in hba if f and not f[0].startswith("#") and "trust" in f]
    assert stat.S_IMODE(os.lstat(data / embedded.PASSFILE).st_mode) == 0o600
    with pytest.raises(ConnectionRefusedError):  # its old TCP listener is gone too
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    attempt = psql_as(intruder, f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres",
                      copy_to_program(marker))
    assert attempt.returncode != 0 and not marker.exists(), attempt


def test_a_normal_users_server_is_closed_to_other_users(servers, intruder, marker):
    """The same as a normal user (``nobody`` here) owning the server: its files are its own, private,
    and another user gets nowhere, even with TCP on."""
    servers.base.chmod(0o755)
    data = servers.data_dir()
    data.parent.chmod(0o777)
    env = {"HOME": str(data.parent), "PYTHONUNBUFFERED": "1", "SKIPLOCK_EMBEDDED_TCP": "1"}
    start = skiplock_as("nobody", ["--data-dir", str(data), "server", "start"], env)
    assert start.returncode == 0, start
    server = embedded._read_running(data)
    for host in (str(server.socket_dir), "127.0.0.1"):
        attempt = psql_as(intruder, f"host={host} port={server.port} user=postgres dbname=postgres",
                          copy_to_program(marker))
        assert attempt.returncode != 0, (host, attempt)
    assert not marker.exists()
    owner = os.stat(data).st_uid
    assert owner == pwd.getpwnam("nobody").pw_uid
    assert os.lstat(data / embedded.PASSFILE).st_uid == owner
    assert stat.S_IMODE(os.lstat(data / embedded.PASSFILE).st_mode) == 0o600
    jobs = skiplock_as("nobody", ["--data-dir", str(data), "migrate"], env)
    assert jobs.returncode == 0, jobs  # and its owner still needs no setup step
    stop = skiplock_as("nobody", ["--data-dir", str(data), "server", "stop"], env)
    assert stop.returncode == 0, stop


def test_another_users_data_dir_is_a_clear_error(servers):
    """Pointing skiplock at someone else's data directory: a clear ConfigurationError (the CLI's
    --data-dir already refuses a directory it cannot read), not a PermissionError from deep inside."""
    data = servers.data_dir()
    servers.start(data)
    servers.base.chmod(0o755)
    probe = ("import sys\nfrom skiplock import errors\nfrom skiplock.backend.postgres import embedded\n"
             "for call in (embedded.ensure_server, embedded.stop_server):\n"
             "    try:\n        call(sys.argv[1])\n    except errors.ConfigurationError as exc:\n        print(exc)\n")
    attempt = python_as("nobody", probe, str(data), env={"HOME": "/tmp"})
    assert attempt.returncode == 0, attempt
    lines = attempt.stdout.splitlines()
    assert len(lines) == 2 and all("belongs to another user" in line for line in lines), attempt
    assert embedded._read_running(data) is not None  # still running
