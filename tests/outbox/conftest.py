"""Fixtures for the outbox tests: the queue's database (``dsn``/``app`` from tests/conftest.py) and a real
HTTP receiver on 127.0.0.1 that applies effects in a separate database with skiplock.dedup."""

from __future__ import annotations

import uuid
from typing import Iterator

import psycopg
import pytest
from outbox_receiver import Receiver
from outbox_support import RelaySpawner

from skiplock.outbox import HttpSink
from psycopg import conninfo, sql


@pytest.fixture(scope="session")
def receiver_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A database of the receiver's own, apart from the queue's (each test's receiver starts by
    emptying it)."""
    name = f"receiver_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield conninfo.make_conninfo(pg_admin_dsn, dbname=name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def receiver(receiver_dsn: str) -> Iterator[Receiver]:
    r = Receiver(receiver_dsn)
    yield r
    r.close()


@pytest.fixture
def spawn(tmp_path) -> Iterator[RelaySpawner]:
    s = RelaySpawner(tmp_path)
    yield s
    s.cleanup()


@pytest.fixture
def sink(receiver: Receiver) -> Iterator[HttpSink]:
    """An HTTP sink to the receiver; a generous timeout: a loaded machine must not turn into a retry."""
    s = HttpSink(receiver.url, timeout=60)
    yield s
    s.close()
