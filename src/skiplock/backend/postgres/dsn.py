"""PostgreSQL's DSNs (libpq key=value or ``postgresql://`` URIs), parsed by libpq's own rules.

Used by :mod:`skiplock.backend.dsn` (the scheme-aware front) for display and redaction: the
settings of a DSN without its secrets, and the secret values it carries. No other skiplock import:
:mod:`skiplock.errors` reaches this through the front, deferred.
"""

from __future__ import annotations

from psycopg import ProgrammingError, conninfo

SECRET_KEYS = ("password", "sslpassword")


def parts(dsn: str) -> dict[str, str] | None:
    """The DSN's settings, or None if libpq cannot parse it."""
    try:
        return {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items()}
    except ProgrammingError:
        return None


def secrets(dsn: str) -> list[str]:
    """The password values of the DSN (none if it does not parse)."""
    found = parts(dsn) or {}
    return [found[k] for k in SECRET_KEYS if found.get(k)]


def without_secrets(dsn: str) -> str | None:
    """The DSN in key=value form without password or sslpassword; None if it does not parse."""
    found = parts(dsn)
    if found is None:
        return None
    for key in SECRET_KEYS:
        found.pop(key, None)
    return conninfo.make_conninfo(**found)
