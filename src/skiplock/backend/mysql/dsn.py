"""MySQL/MariaDB DSNs: ``mysql://user:password@host:port/database?unix_socket=…&connect_timeout=…``
(``mariadb://`` the same). Parsed here into the driver's connect arguments; nothing connects."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError, redact_dsn

SECRET_KEYS = ("password",)
_OPTIONS = {"unix_socket": str, "connect_timeout": float, "charset": str, "ssl_ca": str}


def connect_args(dsn: str) -> dict[str, Any]:
    """PyMySQL's ``connect`` keyword arguments for ``dsn``; ConfigurationError (without the password)
    for a DSN that does not parse, names no database or carries an unknown option."""
    try:
        parts = urlsplit(dsn.strip())
        host, port, user, password = parts.hostname, parts.port, parts.username, parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:
        raise ConfigurationError(f"invalid MySQL DSN {redact_dsn(dsn)}: {exc}") from None
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigurationError(f"the MySQL DSN {redact_dsn(dsn)} must name a database: mysql://user@host/database")
    args: dict[str, Any] = {"host": host or "localhost", "port": port or 3306, "user": unquote(user or ""),
                            "password": unquote(password or ""), "database": database}
    for key, value in query:
        kind = _OPTIONS.get(key)
        if kind is None:
            raise ConfigurationError(f"unknown option {key!r} in the MySQL DSN {redact_dsn(dsn)} "
                                     f"(known: {', '.join(sorted(_OPTIONS))})")
        try:
            args[key] = kind(value)
        except ValueError:
            raise ConfigurationError(f"bad value for {key!r} in the MySQL DSN {redact_dsn(dsn)}") from None
    return args
