"""Fixtures for the acceptance tests (on top of tests/conftest.py's real PostgreSQL databases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

import skiplock
from acceptance_support import Spawner


@pytest.fixture
def effects(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The ``effects`` table the tasks in tasks_app write through ``job.conn``; returns ``db``."""
    db.execute("CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL, "
               "attempt int NOT NULL, pid int NOT NULL)")
    return db


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Starts worker processes; any still running at the end of the test is killed."""
    s = Spawner(tmp_path)
    yield s
    s.cleanup()


@pytest.fixture
def producer(dsn: str) -> Iterator[skiplock.App]:
    """An in-process App on the test database, used only to set up jobs."""
    a = skiplock.App(dsn)
    yield a
    a.close()
