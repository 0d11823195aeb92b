"""tests/integration/test_worker.py (the transaction-lease worker) on PostgreSQL 15 (see on_pg15.py)."""

from on_pg15 import dsn, on_postgresql_15  # noqa: F401
from test_worker import *  # noqa: F401,F403
