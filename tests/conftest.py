"""Test fixtures: a real PostgreSQL (the embedded one unless SKIPLOCK_TEST_DSN is set) and a
fresh database per test, cloned from a migrated template so each test starts isolated and fast."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

import skiplock
from skiplock.backend.postgres import embedded
from mariadb_server import mariadb_admin_dsn, mariadb_dsn, mariadb_server  # noqa: F401 - the private MariaDB (issue 12)
from pg15_server import pg15_admin_dsn, pg15_dsn, pg15_server, pg15_template_db  # noqa: F401 - PostgreSQL 15 (issue 15)
from pgbouncer_server import pgbouncer_session, pgbouncer_transaction  # noqa: F401 - PgBouncer (issue 15)

_counter = itertools.count()


def with_db(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """DSN of a server we may create databases on."""
    given = os.environ.get("SKIPLOCK_TEST_DSN")
    if given:
        yield given
        return
    data_dir = Path(tempfile.mkdtemp(prefix="skiplock-test-")) / "pg"
    server = embedded.ensure_server(data_dir)
    try:
        yield server.dsn
    finally:
        embedded.stop_server(data_dir, mode="immediate")
        shutil.rmtree(data_dir.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    name = f"skiplock_tpl_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    app = skiplock.App(with_db(pg_admin_dsn, name))
    app.migrate()
    app.close()
    yield name
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _fresh_db(admin: str, template: str | None) -> str:
    name = f"skiplock_t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if template:
            c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database with the skiplock schema installed."""
    name = _fresh_db(pg_admin_dsn, template_db)
    yield with_db(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh database without the skiplock schema."""
    name = _fresh_db(pg_admin_dsn, None)
    yield with_db(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def app(dsn: str) -> Iterator[skiplock.App]:
    a = skiplock.App(dsn)
    yield a
    a.close()


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test database, for setup and assertions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SKIPLOCK_DSN", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


PYTHON = sys.executable



@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (``CI`` set, as .ci/run runs), a skipped test fails the run: every server a test needs is
    installed and started by the test set-up there, so nothing may be skipped."""
    if not os.environ.get("CI"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; in CI every test must run:", red=True)
        for report in skipped:
            reporter.write_line(f"  {report.nodeid}: {report.longrepr}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
