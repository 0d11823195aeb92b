"""The readiness probe's one attempt for PostgreSQL (see :mod:`skiplock.reconnect`)."""

from __future__ import annotations

import psycopg

# libpq's shortest connect timeout (it treats 1 as 2).
PROBE_CONNECT_TIMEOUT = 2


def answers(dsn: str) -> bool | None:
    """One probe: True if the server accepts connections, False if it is not there (refused, no
    answer, starting up or shutting down), None if it answered but refused us for another reason
    (a wrong password, no such database): not an outage, nothing to wait for."""
    try:
        psycopg.connect(dsn, connect_timeout=PROBE_CONNECT_TIMEOUT, application_name="skiplock-probe").close()
        return True
    except psycopg.OperationalError as exc:
        state = exc.sqlstate
        if state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03"):
            return False
        return None
    except psycopg.Error:
        return None
