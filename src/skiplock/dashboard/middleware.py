"""The dashboard's authentication middleware: every request but the login page and static files needs
a token or the session cookie (see auth.py); security headers on every response."""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from .auth import Auth


# Served without a credential: the login page, the static CSS/JS, and the health endpoints (no job
# data: observability/health.py).
PUBLIC = ("/login", "/static/", "/livez", "/readyz")


def route_path(scope: Mapping[str, Any]) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def cross_origin(headers: Mapping[str, str], trusted: frozenset[str] = frozenset()) -> str | None:
    """Why a state-changing request is refused as cross-origin, or None when it is not.

    - An ``Origin`` naming a host (every current browser sends it on a POST) must name the host the
      request was sent to (its ``Host``; the scheme is not compared: behind a TLS-terminating proxy an
      https origin reaches us as http), or be one of ``trusted`` (``scheme://host[:port]``, for a
      proxy that rewrites ``Host``).
    - Otherwise (no ``Origin``, or ``Origin: null`` -- what Chromium sends for a form POST from a
      page served with ``Referrer-Policy: no-referrer``, as ours are) ``Sec-Fetch-Site``, when
      present, must be ``same-origin`` or ``none`` (another port of the same host is "same-site":
      refused, as another local user's server could be there). ``Origin: null`` without it is refused.
    - A request with neither header (a script: curl, httpx) is not refused here: it still needs its
      credential and, with a session cookie, the CSRF token."""
    origin = headers.get("origin")
    fetch_site = headers.get("sec-fetch-site")
    if origin is not None and origin != "null":
        if origin.rstrip("/") in trusted:
            return None
        netloc = urlsplit(origin).netloc
        if not netloc or netloc.lower() != headers.get("host", "").lower():
            return f"cross-origin request refused (Origin {origin!r} is not this dashboard)"
        return None
    if fetch_site is not None:
        if fetch_site in ("same-origin", "none"):
            return None
        return f"cross-origin request refused (Sec-Fetch-Site: {fetch_site})"
    if origin == "null":
        return "cross-origin request refused (Origin: null, and no Sec-Fetch-Site to tell where it came from)"
    return None


class AuthMiddleware:
    """Closed by default: every path but the login page and static files needs an identity (see
    auth.py); without one, 401 for what does not ask for HTML, else a redirect to the login page.
    Every state-changing request (POST: actions, login, logout) from another origin gets 403 before
    anything else (:func:`cross_origin`), whatever its credential."""

    def __init__(self, asgi: Any, auth: Auth, trusted_origins: Sequence[str] = ()):
        self.asgi, self.auth = asgi, auth
        self.trusted_origins = frozenset(o.rstrip("/") for o in trusted_origins)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.asgi(scope, receive, send)
            return
        path = route_path(scope)
        request = Request(scope)
        if request.method not in SAFE_METHODS:
            refused = cross_origin(request.headers, self.trusted_origins)
            if refused is not None:
                await JSONResponse({"error": refused}, status_code=403)(scope, receive, send)
                return
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
