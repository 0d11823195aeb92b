"""The flow claims take jobs in the claim order of the plain ones (migration 18): priority, then the time
the job became due (``run_at``), then id -- the claim over several queues for a task with limits
(``claim_flow``), a limited queue's (``claim_flow_of_queue``) and, within a partition, a fair queue's
(``claim_flow_fair``). A job not yet due is never taken."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.backend.base import TaskLimits


def due_at_various_times(app: skiplock.App, **opts: Any) -> list[int]:
    """Jobs of task ``t`` enqueued in an order other than the one they became due; the ids in the
    order the claims must take them (the job due in an hour is left out: never claimed)."""
    now = datetime.now(timezone.utc)

    def put(minutes: float, priority: int = 0) -> int:
        return app.enqueue("t", {}, run_at=now + timedelta(minutes=minutes), priority=priority, **opts)

    later = put(-1)
    earlier = put(-10)
    tied = [put(-5), put(-5)]
    urgent = put(0, priority=-1)
    put(60)  # not due
    return [urgent, earlier, *tied, later]


@pytest.mark.parametrize("claim", ["claim_flow", "claim_flow_of_queue"])
def test_a_flow_claim_takes_jobs_in_priority_run_at_id_order(app: skiplock.App, dsn: str, claim: str):
    if claim == "claim_flow":  # a task with limits, claimed over several queues
        queues, limits = ["default", "other"], [TaskLimits("t", 10, None, None)]
    else:  # a queue with limits, claimed by a worker of that queue
        app.set_queue_limits("default", concurrency=10)
        queues, limits = ["default"], []
    expected = due_at_various_times(app)
    with app.backend.connect_lease() as lease:
        lease.begin()
        got = app.backend.claim_flow_many(lease, 10, queues, ["t"], limits)
        lease.rollback()
    assert [job.id for job, _, _ in got] == expected


def test_a_fair_queues_claim_takes_a_partitions_jobs_in_priority_run_at_id_order(app: skiplock.App, dsn: str):
    """One partition: each claim (a lease of its own, so the others' locks are skipped) takes the
    partition's first available job in claim order."""
    app.set_queue_limits("default", fair=True)
    expected = due_at_various_times(app, partition="p")
    leases = [app.backend.connect_lease() for _ in range(len(expected) + 1)]
    try:
        taken = []
        for lease in leases:
            lease.begin()
            got = app.backend.claim_flow(lease, ["default"], ["t"], [], fair_queue="default")
            taken.append(got[0].id if got else None)
        assert taken == [*expected, None]
    finally:
        for lease in leases:
            lease.close()
    with psycopg.connect(dsn) as c:  # every job still queued, untouched: the leases rolled back
        assert c.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'queued' AND attempts = 0").fetchone()[0] == 6
