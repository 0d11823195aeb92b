"""The dashboard's authentication middleware: every request but the login page and static files needs
a token or the session cookie (see auth.py); security headers on every response."""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from .auth import Auth


PUBLIC = ("/login", "/static/")


def route_path(scope: Mapping[str, Any]) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class AuthMiddleware:
    """Closed by default: every path but the login page and static files needs an identity (see
    auth.py); without one, 401 for what does not ask for HTML, else a redirect to the login page."""

    def __init__(self, asgi: Any, auth: Auth):
        self.asgi, self.auth = asgi, auth

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.asgi(scope, receive, send)
            return
        path = route_path(scope)
        request = Request(scope)
        identity = self.auth.identify(request.headers, request.cookies)
        scope["skiplock.identity"] = identity
        if identity is None and not any(path == p or path.startswith(p) for p in PUBLIC):
            wants_html = "text/html" in request.headers.get("accept", "") and not path.startswith("/api/")
            if wants_html and request.method in ("GET", "HEAD") and "authorization" not in request.headers:
                target = scope.get("root_path", "") + "/login?" + urlencode({"next": path})
                response: Response = RedirectResponse(target, status_code=303)
            else:
                response = JSONResponse({"error": "authentication required"}, status_code=401,
                                        headers={"WWW-Authenticate": 'Bearer realm="skiplock"'})
            await response(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                for name, value in SECURITY_HEADERS:
                    headers.append((name, value))
            await send(message)

        await self.asgi(scope, receive, with_headers)


SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                 b"form-action 'self'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # the login URL carries a token
    (b"cache-control", b"no-store"),
]
