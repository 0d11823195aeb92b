"""Fixtures of the integration tests (tests/contrib): Django configured once per session on a
database of its own (cloned from the migrated template), real models, the real server."""

from __future__ import annotations

import os
from typing import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql



def _database_from(admin_dsn: str, template: str, name: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            sql.Identifier(name), sql.Identifier(template)))
    return conninfo.make_conninfo(admin_dsn, dbname=name)


@pytest.fixture(scope="session")
def django_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """Django set up on a fresh database with skiplock's schema and the test app's tables."""
    import django
    from django.conf import settings

    name = f"skiplock_django_{os.getpid()}"
    dsn = _database_from(pg_admin_dsn, template_db, name)
    parts = conninfo.conninfo_to_dict(dsn)
    options = {k: v for k, v in parts.items() if k not in ("dbname", "user", "password", "host", "port")}
    settings.configure(
        DEBUG=False, USE_TZ=True, SECRET_KEY="tests", DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["skiplock.contrib.django", "django_testapp"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts["dbname"],
                               "USER": parts.get("user", ""), "PASSWORD": parts.get("password", ""),
                               "HOST": parts.get("host", ""), "PORT": parts.get("port", ""), "OPTIONS": options}},
        TASKS={"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend", "QUEUES": ["default", "other"],
                           "OPTIONS": {"DATABASE": "default"}}},
    )
    django.setup()
    from django.db import connection

    from django_testapp.models import Order, Run

    with connection.schema_editor() as editor:
        editor.create_model(Order)
        editor.create_model(Run)
    connection.close()
    yield dsn
    from skiplock.contrib.django.runtime import close_all

    close_all()
    connection.close()
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def django_db(django_dsn: str) -> Iterator[psycopg.Connection]:
    """Django's test database, emptied before each test: an autocommit connection for assertions."""
    with psycopg.connect(django_dsn, autocommit=True) as c:
        c.execute("TRUNCATE django_orders, django_runs, skiplock.jobs RESTART IDENTITY CASCADE")
        yield c
    from django.db import connection

    connection.close()


@pytest.fixture
def db_on() -> Iterator:
    """``db_on(dsn)``: an autocommit connection to that database, closed after the test."""
    opened: list[psycopg.Connection] = []

    def connect(dsn: str) -> psycopg.Connection:
        opened.append(psycopg.connect(dsn, autocommit=True))
        return opened[-1]

    yield connect
    for c in opened:
        c.close()
