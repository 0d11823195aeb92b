"""A fair batch and the process's cursor (worker/flow.py, ``claim_flow_fair_many``): the batch comes,
and runs, in the walk's order of partitions (the index's -- not the order of ids), and the jobs a batch
did not start keep their partitions' turn: the cursor goes back to the last partition that ran, so the
next batch starts with the first partition that did not."""

from __future__ import annotations

import psycopg

import skiplock
from skiplock.worker.bookkeeping import Bookkeeping
from skiplock.worker.flow import FlowControl


def test_a_fair_batch_that_ran_only_its_first_jobs_leaves_the_rest_their_turn(app: skiplock.App,
                                                                             db: psycopg.Connection):
    @app.task("t", queue="fq")
    def t(job):
        pass

    app.set_queue_limits("fq", fair=True)
    # ids run against the partitions' order: p4's jobs first, p0's last
    app.enqueue_many([("t", {}, {"partition": f"p{p}"}) for p in (4, 3, 2, 1, 0) for _ in range(2)])
    flow = FlowControl(app, None, False)
    assert flow.active()
    book = Bookkeeping(app.backend)
    lease = app.backend.connect_lease("x")
    try:
        first = flow.claim(lease, book, slot=0, limit=5)
        parts = [job_partition(db, j.id) for j in first]
        assert parts == ["p0", "p1", "p2", "p3", "p4"]  # walk order, not id order
        lease.rollback()  # as if the batch ran its first two jobs, then ran out of time
        flow.batch_ran(0, {first[0].id, first[1].id})

        second = flow.claim(lease, book, slot=0, limit=5)
        assert [job_partition(db, j.id) for j in second][:3] == ["p2", "p3", "p4"]  # their turn kept
        lease.rollback()
        flow.batch_ran(0, {j.id for j in second})  # all ran: the cursor stays past the last one

        third = flow.claim(lease, book, slot=0, limit=5)
        assert job_partition(db, third[0].id) == "p0"  # the round goes on (wrapped round)
        lease.rollback()
        flow.batch_ran(0, set())  # let go before any ran: the cursor goes back to where it started
        fourth = flow.claim(lease, book, slot=0, limit=5)
        assert [j.id for j in fourth] == [j.id for j in third]
        lease.rollback()
    finally:
        lease.close()
        book.close()


def job_partition(db: psycopg.Connection, job_id: int) -> str:
    return db.execute("SELECT partition FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()[0]
