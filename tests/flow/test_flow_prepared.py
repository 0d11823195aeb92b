"""A flow claim that ends with nothing to run -- every job held back by its key's limit, or no job
at all -- ends its lease transaction with ``Lease.let_go`` (COMMIT: it only locked rows), never a
ROLLBACK: after a ROLLBACK psycopg deallocates every prepared statement of the connection, and the
slot's next claims were planned anew (a flow claim's plan costs 0.4-0.6 ms of server CPU)."""

from __future__ import annotations

import psycopg
import pytest

import skiplock
from skiplock.backend.base import TaskLimits
from skiplock.worker.bookkeeping import Bookkeeping
from skiplock.worker.flow import FlowControl


def prepared(lease) -> int:
    n = lease.conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
    lease.conn.commit()
    return int(n)


def test_flow_claims_that_run_nothing_keep_the_slots_prepared_statements(app: skiplock.App, db: psycopg.Connection):
    @app.task("t", queue="lq", concurrency=1, partition_by="k")
    def t(job, k):
        pass

    app.enqueue_many([("t", {"k": "one"}) for _ in range(40)])
    book = Bookkeeping(app.backend)
    holder, other = app.backend.connect_lease("holder"), app.backend.connect_lease("other")
    try:
        # the other slot claims and runs a few rounds normally (its statements get prepared) ...
        flow = FlowControl(app, None, False)
        for _ in range(8):
            assert len(flow.claim(other, book, slot=1, limit=1)) == 1
            other.commit()  # (the job untouched: a claim, then its release)
        assert prepared(other) > 0
        # ... then key "one" is full: its only slot is held by a lease transaction still open
        assert len(FlowControl(app, None, False).claim(holder, book, slot=0, limit=1)) == 1
        for _ in range(6):
            assert FlowControl(app, None, False).claim(other, book, slot=1, limit=1) == []
            assert not other.in_transaction()
            assert prepared(other) > 0, "a held-back claim dropped the connection's prepared statements"
        holder.commit()
        db.execute("UPDATE skiplock.jobs SET state = 'done', finished_at = now()")
        for _ in range(3):  # nothing left at all
            assert FlowControl(app, None, False).claim(other, book, slot=1, limit=1) == []
            assert prepared(other) > 0, "an empty flow claim dropped the connection's prepared statements"
    finally:
        holder.close()
        other.close()


@pytest.mark.parametrize("claim", ["claim_flow", "claim_flow_of_queue", "claim_flow_fair_many"])
def test_a_prepared_flow_claim_keeps_its_plan(app: skiplock.App, dsn: str, db: psycopg.Connection, claim: str):
    """With a backlog and real statistics, the server keeps one plan for a flow batch claim after its
    first runs, as it does for the plain claim (tests/integration/test_claim_protocol.py): the limit
    is a literal (``with_limit``), the keys held back and the fair cursor are written so that the
    generic plan is the same index walk as the custom ones (tests/flow/test_flow_plans.py), and the
    claim over every queue, or of one queue, runs under its generic plan (``generic_plan_for_claim``).
    Before, every flow claim was planned anew."""
    app.set_queue_limits("fq", fair=True)
    app.set_queue_limits("lq", concurrency=50)
    db.execute("INSERT INTO skiplock.jobs (queue, task, args, partition, priority) "
               "SELECT 'lq', 't', jsonb_build_object('k', g % 1000), NULL, 0 FROM generate_series(1, 20000) g")
    db.execute("INSERT INTO skiplock.jobs (queue, task, partition, priority) "
               "SELECT 'fq', 'u', 'p' || (g % 1000), 0 FROM generate_series(1, 20000) g")
    db.execute("ANALYZE skiplock.jobs")
    limits = [TaskLimits("t", 2, "k", None)]
    with psycopg.connect(dsn) as conn:
        after = None
        for _ in range(20):
            if claim == "claim_flow":
                got = app.backend.claim_flow_many(conn, 32, None, ["t"], limits)  # a worker of every queue
            elif claim == "claim_flow_of_queue":
                got = app.backend.claim_flow_many(conn, 32, ["lq"], ["t"], limits)  # a worker of one queue
            else:
                got = app.backend.claim_flow_fair_many(conn, 32, "fq", after, ["u"], limits)
                after = got[-1][2]
            assert len(got) == 32
            # what a handler would run under, in the same transaction: the session's own setting
            assert conn.execute("SELECT current_setting('plan_cache_mode')").fetchone()[0] == "auto"
            conn.commit()
        plans = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                             "WHERE statement LIKE '%%FOR UPDATE OF j SKIP LOCKED%%'").fetchall()  # the claim (its slots too)
    assert len(plans) == 1, plans
    generic, custom = plans[0]
    # 20 runs, all prepared (from the first: ``queries.prepare_now``), under the generic plan (the
    # claim over every queue and of one queue, `generic_plan_for_claim`) or, for the fair claim's
    # own text, at most 5 custom plans, then the kept generic one
    assert generic + custom == 20 and custom <= 5, plans
