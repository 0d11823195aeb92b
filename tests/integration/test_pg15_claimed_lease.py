"""tests/integration/test_claimed_lease.py (the claimed lease) on PostgreSQL 15 (see on_pg15.py)."""

from on_pg15 import dsn, on_postgresql_15  # noqa: F401
from test_claimed_lease import *  # noqa: F401,F403
