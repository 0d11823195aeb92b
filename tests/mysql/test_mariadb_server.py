"""The private MariaDB of the test set-up (tests/mariadb_server.py): its own server, not the system's."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest


def test_private_server_is_its_own_mariadb_on_loopback(mariadb_server: Any) -> None:
    """A MariaDB 10.11 on 127.0.0.1 with its own socket, run as a non-root user, its files closed to others."""
    assert mariadb_server.version.startswith("10.11"), mariadb_server.version
    home = mariadb_server.socket.parent
    mode = stat.S_IMODE(os.stat(home).st_mode)
    assert mode & 0o077 == 0, oct(mode)
    with mariadb_server.connect() as c, c.cursor() as cur:
        cur.execute("SELECT @@port, @@socket, @@bind_address, @@datadir, CURRENT_USER()")
        port, sock, bind, datadir, user = cur.fetchone()
    assert port == mariadb_server.port and sock == str(mariadb_server.socket)
    assert bind == "127.0.0.1"
    assert datadir.rstrip("/").startswith(str(home))
    owner = os.stat(mariadb_server.process.pid and f"/proc/{mariadb_server.process.pid}").st_uid
    assert owner != 0, "mariadbd runs as root"
    assert user.startswith("skiplock@")


def test_mariadb_dsn_is_a_fresh_empty_database(mariadb_dsn: str, mariadb_server: Any) -> None:
    name = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(name) as c, c.cursor() as cur:
        cur.execute("SHOW TABLES")
        assert cur.fetchall() == ()
        cur.execute("CREATE TABLE t (x INT)")  # the next test's database will not have it


@pytest.mark.parametrize("n", [1, 2])
def test_each_test_gets_its_own_database(mariadb_dsn: str, mariadb_server: Any, n: int) -> None:
    name = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(name) as c, c.cursor() as cur:
        cur.execute("SHOW TABLES")
        assert cur.fetchall() == ()
        cur.execute("CREATE TABLE t (x INT)")
