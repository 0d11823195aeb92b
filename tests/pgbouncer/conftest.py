"""Fixtures of the PgBouncer tests (issue 15 item 4): a real PgBouncer (tests/pgbouncer_server.py) in
front of the embedded PostgreSQL 18.6, in transaction pooling mode and in session mode.

``dsn`` here (and with it ``app`` and ``db`` of tests/conftest.py) names a fresh, migrated database
*through PgBouncer*, once per mode (``pooling``): a ``test_through_pgbouncer_*`` module imports test
functions of tests/integration and tests/outbox unchanged -- the same behaviour asserted -- and runs
them both ways. ``direct_dsn`` names the same database on the server itself (what LISTEN needs behind
a transaction pooler). ``db`` does not prepare statements (a transaction pooler hands each
transaction to any server session: a statement prepared on one is unknown on the next).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "integration"))  # the modules whose tests run here
from pgbouncer_server import bouncer, db, direct_dsn, dsn, pooling  # noqa: E402,F401
