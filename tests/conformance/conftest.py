"""The conformance suite's fixtures: every test runs once per backend in BACKENDS.

A backend entry is a factory ``(request) -> Subject``: it builds the backend on a fresh, migrated
database of its server (fixtures of tests/conftest.py for PostgreSQL) and a :class:`Subject` that
holds it together with the few things a test does that the backend port does not offer yet
(commit/rollback of a lease, its session id, killing that session from outside, reading
notifications). Adding MySQL/MariaDB is one entry here: a factory and a Subject subclass.

Tests drive the backend's verbs only (``subject.backend.claim(...)``, ``.complete(...)``, ...), never
the worker, and never SQL of their own -- except the Subject's test-side clock (``age_finished``),
which stands for time passing.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from conformance_support import PostgresSubject, Subject
from skiplock.backend.base import Backend


def postgres(request: pytest.FixtureRequest) -> Subject:
    """PostgresBackend on a fresh database of the test server (tests/conftest.py's ``dsn``); the admin
    DSN (a superuser) ends sessions from outside, as an operator or a crash would."""
    from skiplock.backend.postgres import PostgresBackend

    dsn = request.getfixturevalue("dsn")
    return PostgresSubject(PostgresBackend(dsn, pool_size=4), dsn, request.getfixturevalue("pg_admin_dsn"))


# One entry per backend; a test id names it (``test_x[postgres]``).
BACKENDS: list[Callable[[pytest.FixtureRequest], Subject]] = [postgres]


@pytest.fixture(params=BACKENDS, ids=lambda factory: factory.__name__)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    s = request.param(request)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def backend(subject: Subject) -> Backend:
    """The backend under test (typed against the port, base.Backend)."""
    return subject.backend


@pytest.fixture
def enqueue(backend: Any) -> Callable[..., int]:
    """Enqueue one job (``task``, ``queue``, ``priority``, ``max_attempts``, ``delay``); its id."""
    from conformance_support import new_job

    def put(task: str = "t", **kw: Any) -> int:
        return backend.enqueue([new_job(task, **kw)])[0]

    return put
