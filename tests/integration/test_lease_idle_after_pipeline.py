"""A lease left idle after a claim sent in a pipeline is still ended by the server at
``lease_timeout`` (docs/guarantees.md, "lease idle past lease_timeout"), on PostgreSQL 18 and 15.

The claims that pipeline: a flow claim (its plan settings around it) and a fair queue's batch. Before
PostgreSQL 18 the Flush message psycopg ends every pipeline with turns the server's idle-in-
transaction timer off until the next Sync: such a lease was never ended there (found in session 33;
src/skiplock/backend/postgres/opening.py). The claim with the job's savepoint is the conformance
suite's (tests/conformance/test_conf_sessions.py)."""

from __future__ import annotations

import psycopg
import pytest

import skiplock
from skiplock.backend.base import TaskLimits

from support import wait_for

LIMITS = [TaskLimits("t", 2, None, None)]


@pytest.mark.parametrize("server", ["postgres18", "postgres15"])
@pytest.mark.parametrize("claim", ["flow", "fair-batch"])
def test_a_lease_idle_after_a_pipelined_claim_is_ended_at_lease_timeout(request, server: str, claim: str):
    dsn = request.getfixturevalue("dsn" if server == "postgres18" else "pg15_dsn")
    app = skiplock.App(dsn, lease_timeout=1)
    try:
        if claim == "fair-batch":
            app.set_queue_limits("default", fair=True)
        app.enqueue("t", {}, partition="a" if claim == "fair-batch" else None)
        lease = app.backend.connect_lease("skiplock-test")
        try:
            lease.begin()
            if claim == "flow":
                got = app.backend.claim_flow_many(lease, 4, None, ["t"], LIMITS)
            else:
                got = app.backend.claim_flow_fair_many(lease, 4, "default", None, ["t"], LIMITS)
            assert len(got) == 1 and lease.in_transaction()
            pid = lease.session_id
            with psycopg.connect(dsn, autocommit=True) as c:
                # idle in its transaction, holding the job's lock, until the server ends it
                wait_for(lambda: not c.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
                         what="the server to end the idle lease")
                assert c.execute("SELECT id FROM skiplock.jobs FOR UPDATE SKIP LOCKED").fetchone()  # free again
        finally:
            lease.close()
    finally:
        app.close()
