"""Run integration tests again on PostgreSQL 15 (issue 15 item 5: the versions people run; 18.6 runs
them in their own modules).

A ``test_pg15_*`` module imports test functions from an integration module unchanged -- the same
behaviour asserted -- and this module's fixtures: ``dsn`` (and with it ``app`` and ``db``) names a fresh
database of the private PostgreSQL 15 (tests/pg15_server.py), and every test checks it runs there.
One module per source module, as their module-level fixtures (``effects``) differ. A representative
subset, to keep CI time: the whole conformance suite runs on both servers (tests/conformance).
"""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture
def dsn(pg15_dsn: str) -> Iterator[str]:
    """The tests of a ``test_pg15_*`` module run on PostgreSQL 15."""
    yield pg15_dsn


@pytest.fixture(autouse=True)
def on_postgresql_15(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn) as c:
        assert 150000 <= c.info.server_version < 160000, c.info.server_version
