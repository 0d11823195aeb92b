"""Which backend a DSN is for, and how to show it without its secrets: the scheme-aware front of
the per-backend DSN parsers (``backend/<name>/dsn.py``).

- ``postgresql://`` / ``postgres://`` URIs and libpq key=value DSNs (no ``scheme://``, including
  the empty DSN: libpq's defaults) are PostgreSQL's, parsed by libpq's rules;
- ``mysql://`` / ``mariadb://`` are MySQL's (backend/mysql/; shown by the URI rules: no password in
  the userinfo nor in a ``password=`` query option);
- any other ``scheme://`` is not supported (shown by the generic URI rules: no password).

Nothing here connects, logs or raises; :mod:`skiplock.errors` uses it (deferred) to redact.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")
MYSQL_SCHEMES = ("mysql", "mariadb")
SECRET_KEYS = ("password", "sslpassword")
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(dsn: str) -> str | None:
    """The DSN's URI scheme, lower-cased; None for a key=value DSN (libpq's form)."""
    match = _SCHEME.match(dsn)
    return match.group(1).lower() if match else None


def is_postgres(dsn: str) -> bool:
    """A PostgreSQL DSN: a postgresql:// or postgres:// URI, or no URI at all (key=value)."""
    found = scheme(dsn)
    return found is None or found in POSTGRES_SCHEMES


def _uri_secrets(dsn: str) -> list[str]:
    try:
        parts = urlsplit(dsn.strip())
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return []
    values = [unquote(password)] if password else []
    return values + [v for k, v in query if k.lower() in SECRET_KEYS and v]


def _uri_without_secrets(dsn: str) -> str | None:
    """``scheme://user@host:port/path?query`` with no password (nor a password in the query)."""
    try:
        parts = urlsplit(dsn.strip())
        host, port, user = parts.hostname, parts.port, parts.username
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return None
    where = (f"{user}@" if user else "") + (host or "") + (f":{port}" if port else "")
    kept = "&".join(f"{k}={v}" for k, v in query if k.lower() not in SECRET_KEYS)
    return f"{parts.scheme}://{where}{parts.path}" + (f"?{kept}" if kept else "")


def secrets(dsn: str) -> list[str]:
    """The secret values (passwords) a DSN carries, as parsed by its backend's rules."""
    if is_postgres(dsn):
        from .postgres.dsn import secrets as postgres_secrets

        return postgres_secrets(dsn)
    return _uri_secrets(dsn)


def without_secrets(dsn: str) -> str | None:
    """The DSN for display without its secrets (PostgreSQL: key=value form); None if it does not parse."""
    if is_postgres(dsn):
        from .postgres.dsn import without_secrets as postgres_without_secrets

        return postgres_without_secrets(dsn)
    return _uri_without_secrets(dsn)
