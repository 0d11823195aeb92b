"""Fixtures of the dashboard's tests: a dashboard over the test database's App, and httpx-based clients
(Starlette's TestClient) driving it in-process (the real app, the real database; no server needed)."""

from __future__ import annotations

from typing import Iterator

import pytest
from starlette.testclient import TestClient  # noqa: F401 - the fixtures' type

import skiplock
from skiplock.dashboard import create_app

from dashboard_support import OPERATOR, VIEWER, client


@pytest.fixture
def dash(app: skiplock.App):
    return create_app(app, token=VIEWER, operator_token=OPERATOR)


@pytest.fixture
def viewer(dash) -> Iterator[TestClient]:
    with client(dash, VIEWER) as c:
        yield c


@pytest.fixture
def operator(dash) -> Iterator[TestClient]:
    with client(dash, OPERATOR) as c:
        yield c


@pytest.fixture
def anonymous(dash) -> Iterator[TestClient]:
    with client(dash) as c:
        yield c
