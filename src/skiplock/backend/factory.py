"""Opening a backend: :func:`open_backend` picks it from the DSN's scheme (see :mod:`.dsn`).

Above the seam nothing names a backend class: the App (and anything else that needs one) gets a
:class:`~skiplock.backend.base.Backend` from here. With no DSN at all, skiplock runs its own
PostgreSQL server (:func:`embedded_server`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from ..errors import ConfigurationError, redact_dsn
from .base import Backend
from .dsn import MYSQL_SCHEMES, POSTGRES_SCHEMES, scheme

SUPPORTED = ("postgresql:// or postgres:// URIs, libpq key=value DSNs, or mysql:// / mariadb:// URIs "
             "(MySQL 8.0.1+ / MariaDB 10.6+)")


def open_backend(dsn: str, schema: str = "skiplock", *, lease_timeout: float = 600.0,
                 connect_timeout: float | None = None, direct_dsn: str | None = None) -> Backend:
    """The backend for ``dsn``. Nothing connects yet (the backend connects at first use).

    - PostgreSQL: ``postgresql://`` / ``postgres://`` URIs and libpq key=value DSNs;
    - ``mysql://`` / ``mariadb://``: the MySQL/MariaDB backend (``backend/mysql/``; its driver, PyMySQL,
      comes with ``pip install 'skiplock[mysql]'``: without it, a ConfigurationError saying so);
    - ``direct_dsn`` (PostgreSQL): the server itself, for LISTEN when ``dsn`` goes through a transaction
      pooler (backend/postgres/pooler.py);
    - any other scheme: :class:`ConfigurationError` naming the supported ones.

    Errors show the DSN without its password."""
    found = scheme(dsn)
    if found is None or found in POSTGRES_SCHEMES:
        from .postgres.backend import PostgresBackend
        from .postgres.connecting import DEFAULT_CONNECT_TIMEOUT

        return PostgresBackend(dsn, schema, lease_timeout=lease_timeout, direct_dsn=direct_dsn,
                               connect_timeout=DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout)
    if found in MYSQL_SCHEMES:
        try:
            from .mysql.backend import MySQLBackend
        except ImportError as exc:
            raise ConfigurationError(f"the MySQL/MariaDB backend needs its driver ({exc.name}): "
                                     "pip install 'skiplock[mysql]'") from None
        return cast(Backend, MySQLBackend(dsn, schema, lease_timeout=lease_timeout,
                                          connect_timeout=5.0 if connect_timeout is None else connect_timeout))
    raise ConfigurationError(f"unsupported DSN scheme {found!r} (DSN {redact_dsn(dsn)}); skiplock supports "
                             f"{SUPPORTED}")


def embedded_server(data_dir: str | Path | None = None, **options: Any) -> Any:
    """Start (or reuse) skiplock's own PostgreSQL server -- what a missing DSN means -- and return
    it (``.dsn`` names it; see :mod:`skiplock.backend.postgres.embedded`)."""
    from .postgres.embedded import ensure_server

    return ensure_server(data_dir, **options)


def stop_embedded_server(data_dir: str | Path | None = None) -> Any:
    """Stop skiplock's own PostgreSQL server (see :func:`embedded_server`)."""
    from .postgres.embedded import stop_server

    return stop_server(data_dir)
