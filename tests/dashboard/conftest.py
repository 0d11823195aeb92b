"""Fixtures of the dashboard's tests: a dashboard over the test database's App, and httpx-based clients
(Starlette's TestClient) driving it in-process (the real app, the real database; no server needed)."""

from __future__ import annotations

from typing import Iterator

import pytest
from starlette.testclient import TestClient

import skiplock
from skiplock.dashboard import create_app

VIEWER = "viewer-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"


@pytest.fixture
def dash(app: skiplock.App):
    return create_app(app, token=VIEWER, operator_token=OPERATOR)


def client(asgi, token: str | None = None) -> TestClient:
    """Starlette's TestClient: an httpx client driving the ASGI app in-process (no redirects followed)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(asgi, base_url="http://testserver", headers=headers, follow_redirects=False)


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
