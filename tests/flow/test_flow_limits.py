"""Concurrency limits across real worker processes (docs/flow-control.md): with a limit per
partition (the task's ``concurrency=2, partition_by="customer"``) and one for the whole queue
(``queue_limits``: 5), the runs recorded inside the handlers -- each [start, end] from the
database's clock, committed with the job's completion -- never overlap more than the limits allow,
for both lease modes and when a worker is SIGKILLed mid-drain; every job ends done, run once."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest
from support import wait_for

import skiplock

JOBS, PARTITIONS, PER_PARTITION, GLOBAL = 120, 12, 2, 5
BATCHED_JOBS = 600

# The most runs in progress at one instant: at some run's start, the runs started by then and not ended.
MAX_OVERLAP = """
SELECT coalesce(max(n), 0) FROM (
  SELECT (SELECT count(*) FROM flow_runs o WHERE o.started <= r.started AND o.ended > r.started
            AND (NOT %(per_part)s OR o.part = r.part)) AS n
    FROM flow_runs r) x"""


def overlap(db: psycopg.Connection[Any], per_part: bool) -> int:
    return db.execute(MAX_OVERLAP, {"per_part": per_part}).fetchone()[0]


def enqueue(dsn: str) -> None:
    with skiplock.App(dsn) as producer:
        producer.backend.set_queue_limit("flow", GLOBAL, None)
        producer.enqueue_many([("limited", {"customer": i % PARTITIONS}, {"queue": "flow"}) for i in range(JOBS)])


def drained(db: psycopg.Connection[Any]) -> bool:
    return db.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done'").fetchone()[0] == 0


def check(db: psycopg.Connection[Any]) -> None:
    done = db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0]
    assert done == JOBS
    runs, distinct = db.execute("SELECT count(*), count(DISTINCT job_id) FROM flow_runs").fetchone()
    assert (runs, distinct) == (JOBS, JOBS)  # every job's run recorded once: none lost, none twice
    assert overlap(db, per_part=True) <= PER_PARTITION
    assert 2 <= overlap(db, per_part=False) <= GLOBAL  # the limit was contended, and held


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_limits_hold_across_worker_processes(dsn: str, runs: psycopg.Connection[Any], spawn: Any, lease: str) -> None:
    enqueue(dsn)
    workers = [spawn.worker(dsn, concurrency=4, lease=lease) for _ in range(3)]
    wait_for(lambda: drained(runs), timeout=90, what="every job done",
             on_timeout=lambda: workers[0].output()[-3000:])
    check(runs)
    # a job held back (its slots taken) was never charged: one attempt each
    assert runs.execute("SELECT array_agg(DISTINCT attempts) FROM skiplock.jobs").fetchone()[0] == [1]


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_limits_hold_when_a_worker_is_killed(dsn: str, runs: psycopg.Connection[Any], spawn: Any, lease: str) -> None:
    enqueue(dsn)
    workers = [spawn.worker(dsn, concurrency=4, lease=lease) for _ in range(3)]
    wait_for(lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] >= JOBS // 4, timeout=60,
             what="a quarter of the jobs done")
    victim = workers[0]
    victim.signal(signal.SIGKILL)
    victim.wait()
    spawn.worker(dsn, concurrency=4, lease=lease)
    wait_for(lambda: drained(runs), timeout=90, what="every job done after the kill",
             on_timeout=lambda: workers[1].output()[-3000:])
    check(runs)
    # no slot is left owned by a lease that ended: the rescuer returns the killed worker's, and frees a
    # slot a finishing write found locked by a claim (it skips it: `complete_claimed`) at its next pass
    # -- so the last jobs' can still be owned the moment the drain ends (seen once under a loaded CI)
    wait_for(lambda: runs.execute("SELECT count(*) FROM skiplock.flow_slots WHERE owner IS NOT NULL").fetchone()[0] == 0,
             timeout=60, what="every slot freed", on_timeout=lambda: workers[1].output()[-3000:])


@pytest.mark.parametrize("kill", [False, True])
def test_limits_hold_for_batched_flow_claims(dsn: str, runs: psycopg.Connection[Any], spawn: Any, kill: bool) -> None:
    """With a batch budget of 1 s the batching policy counts the 20 ms handlers as fast (under a
    quarter of the budget) and claims them in batches: several flow-controlled jobs share one lease
    transaction (`claim_flow` with a limit > 1), each with its own slots, held to the batch's COMMIT
    -- the limits still hold, with a SIGKILL mid-drain too, and batches did run."""
    with skiplock.App(dsn) as producer:
        producer.backend.set_queue_limit("flow", GLOBAL, None)
        producer.enqueue_many([("limited", {"customer": i % PARTITIONS}, {"queue": "flow"}) for i in range(BATCHED_JOBS)])
    options = ("--batch-budget", "1")
    workers = [spawn.worker(dsn, concurrency=4, options=options) for _ in range(3)]
    if kill:
        wait_for(lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] >= BATCHED_JOBS // 4,
                 timeout=60, what="a quarter of the jobs done")
        workers[0].signal(signal.SIGKILL)
        workers[0].wait()
        spawn.worker(dsn, concurrency=4, options=options)
    wait_for(lambda: drained(runs), timeout=90, what="every job done", on_timeout=lambda: workers[1].output()[-3000:])
    done = runs.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0]
    assert done == BATCHED_JOBS
    n, distinct, xacts = runs.execute("SELECT count(*), count(DISTINCT job_id), count(DISTINCT xact) "
                                      "FROM flow_runs").fetchone()
    assert (n, distinct) == (BATCHED_JOBS, BATCHED_JOBS)  # none lost, none twice
    assert xacts < n  # some jobs shared a transaction: the batched flow claim ran
    assert overlap(runs, per_part=True) <= PER_PARTITION
    assert overlap(runs, per_part=False) <= GLOBAL
