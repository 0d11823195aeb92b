"""Which SQL dialect the verifiers (``skiplock scenario``, ``skiplock demo``) speak for a DSN.

The verifiers check the queue with their own SQL on their own connections, independently of the
backend port they check; that SQL and those connections are per database, in ``pg_dialect.py``
(PostgreSQL) and ``mysql_dialect.py`` (MySQL/MariaDB), which offer the same functions. scenario.py
and demo.py are backend-neutral: they import neither driver, only the module returned here.
"""

from __future__ import annotations

from types import ModuleType

from ..backend.dsn import MYSQL_SCHEMES, POSTGRES_SCHEMES, scheme
from ..errors import ConfigurationError


def for_dsn(dsn: str) -> ModuleType:
    """The dialect module for ``dsn``'s scheme (a key=value DSN is PostgreSQL's); ConfigurationError
    for a scheme no backend speaks."""
    found = scheme(dsn)
    if found in MYSQL_SCHEMES:
        from . import mysql_dialect

        return mysql_dialect
    if found is None or found in POSTGRES_SCHEMES:
        from . import pg_dialect

        return pg_dialect
    raise ConfigurationError(f"the scenario and the demo speak PostgreSQL and MySQL/MariaDB, not {found}://")
