"""Fault injection on PostgreSQL 15 (issue 15 item 5): ``pg_terminate_backend`` mid-job and a handler
hanging past its timeout (where 15, without ``transaction_timeout``, relies on the statement and
idle-in-transaction timeouts), both lease modes.

The test functions are imported unchanged from their modules -- the same invariants -- and run here on
a fresh database of the private PostgreSQL 15 (tests/pg15_server.py): this module's ``fdsn`` names it
(and with it ``fdb``, ``producer`` and the worker processes). Their rows in the summary table say
"(PostgreSQL 15)". The restart, partition and SIGKILL scenarios run on 18.6 only (CI time).
"""

from __future__ import annotations

from typing import Iterator

import psycopg
import pytest

from faults_support import SUMMARY
from test_fault_handlers import test_handler_hanging_past_its_timeout  # noqa: F401
from test_fault_terminate import test_terminate_backend_of_a_worker_mid_job  # noqa: F401

# tests/faults/conftest.py's effects table (a conftest is not importable by name: several share it)
EFFECTS_DDL = ("CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL, "
               "attempt int NOT NULL, pid int NOT NULL, lease text NOT NULL)")


@pytest.fixture
def fdsn(pg15_dsn: str) -> Iterator[str]:
    """A fresh, migrated database of PostgreSQL 15 with the suite's ``effects`` table."""
    with psycopg.connect(pg15_dsn, autocommit=True) as c:
        assert 150000 <= c.info.server_version < 160000, c.info.server_version
        c.execute(EFFECTS_DDL)
    yield pg15_dsn


@pytest.fixture(autouse=True)
def _summary_rows_say_postgresql_15() -> Iterator[None]:
    before = len(SUMMARY)
    yield
    for row in SUMMARY[before:]:
        row.scenario += " (PostgreSQL 15)"
