"""Shared by the dashboard's tests: the tokens and an in-process client."""

from __future__ import annotations

from starlette.testclient import TestClient

VIEWER = "viewer-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"


def client(asgi, token: str | None = None) -> TestClient:
    """Starlette's TestClient: an httpx client driving the ASGI app in-process (no redirects followed)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(asgi, base_url="http://testserver", headers=headers, follow_redirects=False)
