"""Fair scheduling across partitions (docs/flow-control.md, `claim_flow_fair`): in a fair queue one
partition with 1,000 ready jobs (the issue's 10,000, scaled down) and nine with 10 each, enqueued
after it -- the small partitions' jobs all start within the first ~100 claims (round-robin: ten
rounds of ten partitions), a high-priority job of the big partition starts in its first round
(priorities hold within a partition), and a lone partition still gets every claim (work-conserving)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from support import wait_for

import skiplock
from skiplock.errors import ConfigurationError

BIG, SMALL, SMALL_JOBS = 1000, 9, 10


def make_app(dsn: str) -> skiplock.App:
    app = skiplock.App(dsn)

    @app.task("fair_job", queue="fair")
    def fair_job(job, part):
        job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                         "VALUES (%s, %s, clock_timestamp(), clock_timestamp(), pg_backend_pid())",
                         (job.id, part))

    return app


def run_until(app: skiplock.App, condition: Any, concurrency: int = 2, **options: Any) -> None:
    worker = app.worker(concurrency=concurrency, poll_interval=0.05, handle_signals=False, adaptive_limit=False,
                        **options)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(condition, timeout=60, what="the runs")
    finally:
        worker.stop()
        thread.join(30)


def test_small_partitions_are_not_delayed_by_a_big_one(dsn: str, runs: psycopg.Connection[Any]) -> None:
    app = make_app(dsn)
    app.set_queue_limits("fair", fair=True)
    app.enqueue_many([("fair_job", {"part": "big"}, {"partition": "big"}) for _ in range(BIG - 1)])
    urgent = app.enqueue("fair_job", {"part": "big"}, partition="big", priority=-5)
    app.enqueue_many([("fair_job", {"part": f"s{p}"}, {"partition": f"s{p}"})
                      for p in range(SMALL) for _ in range(SMALL_JOBS)])
    small = SMALL * SMALL_JOBS
    run_until(app, lambda: runs.execute("SELECT count(*) FROM flow_runs WHERE part <> 'big'").fetchone()[0] == small)
    order = [r for r in runs.execute("SELECT job_id, part FROM flow_runs ORDER BY started, job_id")]
    last_small = max(i for i, (_, part) in enumerate(order) if part != "big")
    assert last_small < 110, f"the last small partition's job started as claim {last_small + 1}"
    big_runs = [job_id for job_id, part in order if part == "big"]
    assert urgent in big_runs[:2]  # among its first claims (2 slots) is its most urgent job
    app.close()


def test_a_lone_partition_gets_every_claim(dsn: str, runs: psycopg.Connection[Any]) -> None:
    app = make_app(dsn)
    app.set_queue_limits("fair", fair=True)
    app.enqueue_many([("fair_job", {"part": "only"}, {"partition": "only"}) for _ in range(30)])
    run_until(app, lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == 30)
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == 30
    app.close()


def run_one_slot_until(app: skiplock.App, condition: Any) -> None:
    """One worker slot: its claims are the process's round-robin exactly (no second slot interleaving)."""
    worker = app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, adaptive_limit=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(condition, timeout=60, what="the runs")
    finally:
        worker.stop()
        thread.join(30)


def test_a_partition_of_weight_3_gets_3_times_the_claims(dsn: str, runs: psycopg.Connection[Any]) -> None:
    app = make_app(dsn)
    app.set_queue_limits("fair", fair=True, weights={"heavy": 3})
    assert app.queue_limits()[0]["weights"] == {"heavy": 3}
    for part in ("heavy", "light", "other"):
        app.enqueue_many([("fair_job", {"part": part}, {"partition": part}) for _ in range(60)])
    run_one_slot_until(app, lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == 180)
    order = [part for (part,) in runs.execute("SELECT part FROM flow_runs ORDER BY started, job_id")]
    first = order[:75]  # while every partition has ready jobs: rounds of 3 + 1 + 1
    assert (first.count("heavy"), first.count("light"), first.count("other")) == (45, 15, 15), first
    # work-conserving: heavy ran out first, then the other two shared every claim
    assert order.index("heavy") < order.index("light") and "heavy" not in order[100:]
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == 180
    app.close()


def test_bad_weights_are_refused(app: skiplock.App) -> None:
    with pytest.raises(ConfigurationError, match="weight of partition 'a' must be a whole number from 1 to 1000"):
        app.set_queue_limits("fair", fair=True, weights={"a": 0})
    with pytest.raises(ConfigurationError, match="weights apply to a fair queue"):
        app.set_queue_limits("fair", weights={"a": 2})
    with pytest.raises(ConfigurationError, match="a weight's partition must be a non-empty string"):
        app.set_queue_limits("fair", fair=True, weights={"": 2})
    assert app.queue_limits() == []


def test_a_fair_batch_let_go_for_a_job_that_runs_alone_keeps_the_partitions_turn(dsn: str,
                                                                                 runs: psycopg.Connection[Any]):
    """A fair batch whose first job must run alone (worker/batching.py: here a task with a timeout) is
    let go and that job claimed alone: the partitions the let-go batch walked keep their turn (the
    process's cursor stays where it was), so the alone job -- the first job of the first partition --
    starts first and every partition gets a job within the first round."""
    from skiplock.worker.batching import WholeBatches

    app = make_app(dsn)

    @app.task("timed_job", queue="fair", timeout=30)
    def timed_job(job, part):
        job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                         "VALUES (%s, %s, clock_timestamp(), clock_timestamp(), pg_backend_pid())", (job.id, part))

    app.set_queue_limits("fair", fair=True)
    parts = [f"p{p:02}" for p in range(16)]
    timed = app.enqueue("timed_job", {"part": parts[0]}, partition=parts[0])
    app.enqueue_many([("fair_job", {"part": part}, {"partition": part}) for _ in range(2) for part in parts])
    # one slot, whole batches of 8 (a budget the no-op jobs never run out of: what is tested here is
    # the let-go batch, not one cut short -- that is tests/flow/test_flow_fair_cursor.py)
    run_until(app, lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == 33, concurrency=1,
              batch_policy=WholeBatches(batch_size=8, batch_budget=10))
    order = [r for r in runs.execute("SELECT job_id, part FROM flow_runs ORDER BY started, job_id")]
    assert order[0] == (timed, parts[0]), order[:10]
    assert sorted(part for _, part in order[1:16]) == parts[1:], order[:17]
    app.close()


def test_a_fair_batch_meeting_new_partitions_keeps_their_turn(dsn: str, runs: psycopg.Connection[Any]):
    """Partitions whose slot rows do not exist yet (a per-partition limit, their first jobs) met by a
    fair batch: their slots are created and the batch tried again from the same place, as the single
    fair claim does -- they are not stepped over for a round (so every partition starts a job before
    any starts its second)."""
    from skiplock.worker.batching import WholeBatches

    app = skiplock.App(dsn)

    @app.task("limited_fair_job", queue="fair", concurrency=1)
    def limited_fair_job(job, part):
        job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                         "VALUES (%s, %s, clock_timestamp(), clock_timestamp(), pg_backend_pid())", (job.id, part))

    app.set_queue_limits("fair", fair=True)
    parts = [f"p{p:02}" for p in range(16)]
    # half the partitions (every other one) have their slot rows already, as after earlier jobs
    app.backend.ensure_slots(runs, [(f'["task", "limited_fair_job", "{part}"]', 1) for part in parts[::2]])
    runs.commit()
    app.enqueue_many([("limited_fair_job", {"part": part}, {"partition": part}) for _ in range(2) for part in parts])
    # one slot, whole batches of 8 (a budget the no-op jobs never run out of: what is tested here is
    # a batch meeting new partitions, not one cut short -- that is tests/flow/test_flow_fair_cursor.py)
    run_until(app, lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == 32, concurrency=1,
              batch_policy=WholeBatches(batch_size=8, batch_budget=10))
    order = [part for (part,) in runs.execute("SELECT part FROM flow_runs ORDER BY started, job_id")]
    assert sorted(order[:16]) == parts, order
    app.close()
