"""The dashboard's backend-neutral tests on every backend (issue 12 + 13: the dashboard on MariaDB too):
a module that does ``from dashboard_backends import backend_dsn, pytest_generate_tests`` runs each test
that uses the database (``dsn``, hence ``app``, ``dash``, ``viewer``, ...) once per backend, as
``test_x[postgres]`` and ``test_x[mariadb]``, with the same test code, as tests/conformance does.

``dsn`` there is a fresh, migrated database of that backend's server: the embedded PostgreSQL
(tests/conftest.py's ``dsn``) or the private MariaDB 10.11 (tests/mariadb_server.py's ``mariadb_dsn``).
A test a backend cannot run yet is listed in :data:`NOT_YET` with the reason: it is not generated for
that backend (never skipped)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

BACKENDS = ["postgres", "mariadb"]

# test function name -> why it is not generated for that backend
NOT_YET: dict[str, dict[str, str]] = {
    "mariadb": {
        "test_queues_page_shows_flow_control_limits": "flow control (queue limits) is not on the MySQL backend",
        "test_the_queues_page_shows_each_queues_limits": "flow control (queue limits) is not on the MySQL backend",
    },
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dsn" not in metafunc.fixturenames:
        return
    name = metafunc.definition.originalname
    backends = [b for b in BACKENDS if name not in NOT_YET.get(b, {})]
    metafunc.parametrize("dsn", backends, ids=backends, indirect=True)


@pytest.fixture(name="dsn")
def backend_dsn(request: pytest.FixtureRequest) -> str:
    """A fresh database with the skiplock schema, on this test's backend (overrides tests/conftest.py's)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("dsn"))  # the next ``dsn`` up: tests/conftest.py's
    from skiplock.backend.mysql import MySQLBackend

    dsn = str(request.getfixturevalue("mariadb_dsn"))
    backend = MySQLBackend(dsn)
    try:
        backend.migrate()
    finally:
        backend.close()
    return dsn


def password_of(dsn: str) -> str | None:
    """The password in a URL DSN (``scheme://user:password@host/db``) or a key=value one."""
    if "://" in dsn:
        password = urlsplit(dsn).password
        return None if password is None else unquote(password)
    for part in dsn.split():
        if part.startswith("password="):
            return part[len("password="):]
    return None


def run_sql(dsn: str, postgres: str, mysql: str, params: tuple[Any, ...] = ()) -> None:
    """One statement of test-side set-up on the test's database (``%s`` placeholders): ``postgres``'s
    text on PostgreSQL, ``mysql``'s on MySQL/MariaDB (``{schema}_`` table prefixes: ``skiplock_``)."""
    if dsn.startswith(("mysql://", "mariadb://")):
        import pymysql

        parts = urlsplit(dsn)
        conn = pymysql.connect(host=parts.hostname, port=parts.port or 3306, user=parts.username,
                               password=unquote(parts.password or ""), database=parts.path.lstrip("/"), autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(mysql, params)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(postgres, params)
