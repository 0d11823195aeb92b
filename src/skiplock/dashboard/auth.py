"""Who may see and do what: tokens, roles, the session cookie, CSRF (see docs/dashboard.md).

**Closed by default.** Every request but the login page and the static files needs a credential:
``Authorization: Bearer <token>``, or the session cookie a browser gets by logging in once with a
token. Without one: 401 (the API, ``/metrics``, anything that does not ask for HTML) or a redirect
to the login page -- never any job data.

**Roles.** ``viewer`` (read-only: every page) and ``operator`` (also every action), each with its
own token. Tokens are compared in constant time (:func:`hmac.compare_digest`) and never logged or
rendered.

**The session cookie** (``skiplock_session``: HttpOnly, SameSite=Strict, Path the dashboard's
mount point, Secure when served over https) holds the role, an expiry and a random nonce, signed
with HMAC-SHA256 under a key derived from the process's secret *and* that role's token: changing a
token ends every session made with it; a forged or expired cookie is no credential.

**CSRF.** An action made with the session cookie must carry the session's CSRF token (a hidden
``csrf`` form field or an ``X-CSRF-Token`` header), derived from the session's nonce; the cookie
alone (which a browser attaches to a cross-site request) is refused with 403. A bearer request
carries its credential explicitly, so it needs no CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Mapping

VIEWER = "viewer"
OPERATOR = "operator"
COOKIE = "skiplock_session"
SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True)
class Identity:
    """An authenticated request: its ``role``, ``via`` ("bearer" or "session") and, for a
    session, the CSRF token its actions must carry."""

    role: str
    via: str
    csrf: str | None = None

    @property
    def can_act(self) -> bool:
        return self.role == OPERATOR

    def actor(self, client: str | None) -> str:
        """Who, for the audit log: role, how authenticated, from where (never a token)."""
        return f"{self.role} ({self.via}{', ' + client if client else ''})"


def new_token() -> str:
    """A random token (as printed in the login URL when none was configured)."""
    return secrets.token_urlsafe(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Auth:
    """The tokens of each role and the signing of sessions. ``viewer_token`` / ``operator_token``:
    None means nobody has that role. At least one is required (there is no open mode)."""

    def __init__(self, viewer_token: str | None, operator_token: str | None, *, secret: bytes | None = None,
                 session_seconds: float = SESSION_SECONDS):
        tokens = {VIEWER: viewer_token, OPERATOR: operator_token}
        for role, token in tokens.items():
            if token is not None and (not isinstance(token, str) or len(token) < 16 or token != token.strip()):
                raise ValueError(f"the {role} token must be a text of at least 16 characters without "
                                 "surrounding spaces")
        if viewer_token is None and operator_token is None:
            raise ValueError("the dashboard needs a viewer token or an operator token (it has no open mode)")
        if viewer_token is not None and viewer_token == operator_token:
            raise ValueError("the viewer and operator tokens must differ")
        self._tokens = {role: token.encode() for role, token in tokens.items() if token is not None}
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self.session_seconds = session_seconds

    def __repr__(self) -> str:  # never the tokens
        return f"<Auth roles={sorted(self._tokens)}>"

    def role_for_token(self, token: str | None) -> str | None:
        """The role a token gives, compared in constant time against every role's token."""
        if not token:
            return None
        given = token.encode("utf-8", "replace")
        found = None
        for role, expected in self._tokens.items():
            if hmac.compare_digest(given, expected):  # every role compared, whatever matched
                found = role
        return found

    def _key(self, role: str) -> bytes:
        return hashlib.sha256(self._secret + b"\0" + role.encode() + b"\0" + self._tokens[role]).digest()

    def make_session(self, role: str) -> str:
        payload = _b64(json.dumps({"r": role, "e": int(time.time() + self.session_seconds),
                                   "n": secrets.token_urlsafe(16)}, separators=(",", ":")).encode())
        return payload + "." + _b64(hmac.new(self._key(role), payload.encode(), hashlib.sha256).digest())

    def read_session(self, value: str | None) -> Identity | None:
        """The identity a session cookie carries, or None (absent, forged, expired, or its role's
        token changed)."""
        if not value or value.count(".") != 1:
            return None
        payload, signature = value.split(".")
        try:
            data: Mapping[str, Any] = json.loads(_unb64(payload))
            role = data["r"]
            if role not in self._tokens:
                return None
            expected = _b64(hmac.new(self._key(role), payload.encode(), hashlib.sha256).digest())
            if not hmac.compare_digest(signature.encode(), expected.encode()):
                return None
            if float(data["e"]) < time.time():
                return None
            csrf = _b64(hmac.new(self._key(role), b"csrf:" + str(data["n"]).encode(), hashlib.sha256).digest())
        except (ValueError, KeyError, TypeError):
            return None
        return Identity(role, "session", csrf)

    def identify(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Identity | None:
        """The request's identity: its bearer token if it sends one (a wrong one is no credential,
        whatever the cookie), else its session cookie."""
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            role = self.role_for_token(token.strip()) if scheme.lower() == "bearer" else None
            return Identity(role, "bearer") if role else None
        return self.read_session(cookies.get(COOKIE))

    @staticmethod
    def csrf_ok(identity: Identity, given: str | None) -> bool:
        """May this identity act with this CSRF token? A bearer request needs none."""
        if identity.via == "bearer":
            return True
        if not given or identity.csrf is None:
            return False
        return hmac.compare_digest(given.encode(), identity.csrf.encode())
