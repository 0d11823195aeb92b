"""A fair batch and the process's cursor (worker/flow.py, ``claim_flow_fair_many``): the batch comes,
and runs, in the walk's order of partitions (the index's -- not the order of ids), and the jobs a batch
did not start keep their partitions' turn: the cursor goes back to the last partition that ran, so the
next batch starts with the first partition that did not."""

from __future__ import annotations

import psycopg
import pytest

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


@pytest.mark.parametrize("queue", ["fq", "kø-队列"])
def test_a_fair_queue_at_its_limit_is_given_up_after_one_try_whatever_its_name(app: skiplock.App, queue: str):
    """A fair claim that finds its queue's own limit full gives the queue up at once (the whole queue
    waits); a partition's key found full is only stepped over. The keys come from the server (jsonb
    text keeps non-ASCII characters as they are), so the queue's own key is recognised by its value:
    compared as Python's ``json.dumps`` text (``\\u00f8``), a queue named with non-ASCII characters was
    taken for a partition, and the claim walked on for every try of its round."""
    @app.task("t", queue=queue)
    def t(job):
        pass

    app.set_queue_limits(queue, fair=True, concurrency=1)
    app.enqueue_many([("t", {}, {"partition": f"p{p}"}) for p in range(8) for _ in range(2)])
    book = Bookkeeping(app.backend)
    holder, other = app.backend.connect_lease("holder"), app.backend.connect_lease("other")
    tries = []
    real = app.backend.claim_flow_fair_many

    def counted(*args, **kwargs):
        tries.append(1)
        return real(*args, **kwargs)

    try:
        assert len(FlowControl(app, None, False).claim(holder, book, slot=0, limit=4)) >= 1  # the queue's slot
        app.backend.claim_flow_fair_many = counted  # type: ignore[method-assign]
        assert FlowControl(app, None, False).claim(other, book, slot=1, limit=4) == []
        assert len(tries) == 1, len(tries)
    finally:
        app.backend.claim_flow_fair_many = real  # type: ignore[method-assign]
        holder.close()
        other.close()
        book.close()
