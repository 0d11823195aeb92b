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

from conformance_support import MariaDBSubject, PostgresSubject, Subject, new_job
from skiplock.backend.base import Backend


def postgres(request: pytest.FixtureRequest, **options: Any) -> Subject:
    """PostgresBackend on a fresh database of the test server (tests/conftest.py's ``dsn``); the admin
    DSN (a superuser) ends sessions from outside, as an operator or a crash would. ``options``: the
    backend's own (``lease_timeout``, ...)."""
    from skiplock.backend.postgres import PostgresBackend

    dsn = request.getfixturevalue("dsn")
    return PostgresSubject(PostgresBackend(dsn, pool_size=4, **options), dsn, request.getfixturevalue("pg_admin_dsn"))


# What a backend offers beyond the verbs every backend has (issue 11 item 4: backend capabilities; the
# port declares them as backend.capabilities, and each entry names here the ones its tests are
# generated for). A test marked
# ``@pytest.mark.capability("...")`` runs on the backends that have it, and only there: it is not
# generated -- never skipped -- for the others.
#   server_bounds_leases: the server itself ends a lease transaction idle past lease_timeout or a
#     task's timeout (PostgreSQL: idle_in_transaction_session_timeout, transaction_timeout); a
#     backend without it leaves that to the worker's watchdog.
postgres.capabilities = {"server_bounds_leases"}  # type: ignore[attr-defined]


def postgres15(request: pytest.FixtureRequest, **options: Any) -> Subject:
    """PostgresBackend on a fresh database of the private PostgreSQL 15 (tests/pg15_server.py): the
    oldest server version the suite runs on (issue 15: the versions people run)."""
    from skiplock.backend.postgres import PostgresBackend

    dsn = request.getfixturevalue("pg15_dsn")
    return PostgresSubject(PostgresBackend(dsn, pool_size=4, **options), dsn, request.getfixturevalue("pg15_admin_dsn"))


postgres15.capabilities = postgres.capabilities  # type: ignore[attr-defined]  # transaction_timeout aside (17+)



def mariadb(request: pytest.FixtureRequest, **options: Any) -> Subject:
    """MySQLBackend on a fresh, migrated database of the private MariaDB 10.11 (tests/mariadb_server.py);
    the server's admin connection ends sessions from outside (KILL)."""
    from skiplock.backend.mysql import MySQLBackend

    dsn = request.getfixturevalue("mariadb_dsn")
    backend = MySQLBackend(dsn, pool_size=4, **options)
    backend.migrate()
    return MariaDBSubject(backend, dsn, request.getfixturevalue("mariadb_server"))


mariadb.capabilities = set()  # type: ignore[attr-defined]  # no server bound on a lease's duration
# The tests of what the MySQL backend does not implement yet (issue 12), by test function, with the
# reason: not generated for it (never skipped), and listed in README.md under "not yet on MariaDB".
mariadb.not_yet = {  # type: ignore[attr-defined]
}

# One entry per backend; a test id names it (``test_x[postgres]``).
BACKENDS: list[Callable[..., Subject]] = [postgres, postgres15, mariadb]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "capability(name, ...): run only on backends that have these capabilities")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "make_subject" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("capability")
    wanted = set(marker.args) if marker is not None else set()
    name = metafunc.definition.originalname
    factories = [f for f in BACKENDS
                 if wanted <= getattr(f, "capabilities", set()) and name not in getattr(f, "not_yet", {})]
    metafunc.parametrize("make_subject", factories, ids=[f.__name__ for f in factories], indirect=True)


@pytest.fixture
def make_subject(request: pytest.FixtureRequest) -> Iterator[Callable[..., Subject]]:
    """Builds the backend of this test's entry in BACKENDS, with the backend options given."""
    made: list[Subject] = []

    def make(**options: Any) -> Subject:
        made.append(request.param(request, **options))
        return made[-1]

    try:
        yield make
    finally:
        for s in made:
            s.close()


@pytest.fixture
def subject(make_subject: Callable[..., Subject]) -> Subject:
    return make_subject()


@pytest.fixture
def backend(subject: Subject) -> Backend:
    """The backend under test (typed against the port, base.Backend)."""
    return subject.backend


@pytest.fixture
def enqueue(backend: Any) -> Callable[..., int]:
    """Enqueue one job (``task``, ``queue``, ``priority``, ``max_attempts``, ``run_at``); its id."""
    def put(task: str = "t", **kw: Any) -> int:
        return backend.enqueue([new_job(task, **kw)])[0]

    return put
