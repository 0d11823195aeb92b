"""Sequences (docs/flow-control.md, "Sequences"; migration 15): jobs with the same sequence key run one
at a time in enqueue order -- later ones wait 'blocked' while the head is queued, running or being
retried -- and a job that fails for good does to the rest of its sequence what its rule says:
``wait`` (held until it is retried or cancelled), ``skip`` (they go on) or ``fail`` (they fail too)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.errors import ConfigurationError, InvalidJob
from skiplock.testing import drain


def states(db: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = dict(db.execute("SELECT id, state FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall())
    return [rows[i] for i in ids]


def build(dsn: str, rule: str = "wait", lease: str = "transaction") -> tuple[skiplock.App, list[Any]]:
    app = skiplock.App(dsn)
    log: list[Any] = []

    @app.task("step", sequence_by="account", sequence_on_failure=rule, max_attempts=2, retry=0, lease=lease)
    def step(job, n, account=None, fail=False):
        log.append((account, n, job.attempt))
        if fail:
            raise RuntimeError(f"step {n} failed")

    return app, log


def test_only_the_head_of_a_sequence_is_queued_the_rest_blocked(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, _ = build(dsn)
    a = [app.enqueue("step", {"account": "a", "n": i}) for i in range(3)]
    b = app.enqueue_many([("step", {"account": "b", "n": i}) for i in range(2)])
    other = app.enqueue("step", {"account": 7, "n": 0})
    assert states(db, a) == ["queued", "blocked", "blocked"]
    assert states(db, b) == ["queued", "blocked"]
    assert states(db, [other]) == ["queued"]
    assert app.get_job(a[1]).state == skiplock.JobState.BLOCKED
    seqs = dict(db.execute("SELECT key, head FROM skiplock.job_sequences").fetchall())
    assert seqs == {"a": a[0], "b": b[0], "7": other}


def test_jobs_of_a_sequence_run_in_enqueue_order_and_the_sequence_row_goes(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, log = build(dsn)
    app.enqueue_many([("step", {"account": "a", "n": i}) for i in range(5)])
    app.enqueue("step", {"n": 9}, sequence="a")  # explicit key: the same sequence
    drain(app, concurrency=4)
    assert [n for _, n, _ in log] == [0, 1, 2, 3, 4, 9]
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM skiplock.job_sequences").fetchone()[0] == 0


def test_a_retrying_head_keeps_its_place(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, log = build(dsn)
    first = app.enqueue("step", {"account": "a", "n": 0, "fail": True})
    second = app.enqueue("step", {"account": "a", "n": 1})
    app.enqueue("step", {"account": "b", "n": 0})
    # one attempt of the head: failed, retried later (not failed for good) -- the next stays blocked
    db.execute("UPDATE skiplock.jobs SET max_attempts = 3 WHERE id = %s", [first])
    drain(app, concurrency=2)
    assert states(db, [first, second]) == ["failed", "blocked"]  # 'wait' after its last attempt
    assert [(acc, n) for acc, n, _ in log if acc == "a"] == [("a", 0), ("a", 0), ("a", 0)]


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_rule_wait_holds_the_rest_until_the_failed_job_is_retried(dsn: str, db: psycopg.Connection[Any], lease: str) -> None:
    app, log = build(dsn, "wait", lease)
    ids = [app.enqueue("step", {"account": "a", "n": i, "fail": i == 1}) for i in range(4)]
    drain(app, concurrency=2)
    assert states(db, ids) == ["done", "failed", "blocked", "blocked"]
    db.execute("UPDATE skiplock.jobs SET args = args - 'fail' WHERE id = %s", [ids[1]])
    app.retry_job(ids[1])
    assert states(db, ids[1:]) == ["queued", "blocked", "blocked"]
    drain(app, concurrency=2)
    assert states(db, ids) == ["done"] * 4
    assert [n for _, n, _ in log] == [0, 1, 1, 1, 2, 3]


def test_rule_wait_cancelling_the_failed_job_lets_the_rest_go_on(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, log = build(dsn, "wait")
    ids = [app.enqueue("step", {"account": "a", "n": i, "fail": i == 0}) for i in range(3)]
    drain(app)
    assert states(db, ids) == ["failed", "blocked", "blocked"]
    # a failed job holding its sequence is not pruned away (it would strand the rest)
    assert app.prune({"failed": 0})["failed"] == 0
    assert app.cancel_job(ids[0], "give up") == skiplock.JobState.CANCELLED
    assert states(db, ids) == ["cancelled", "queued", "blocked"]
    drain(app)
    assert states(db, ids) == ["cancelled", "done", "done"]


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_rule_skip_lets_the_rest_go_on(dsn: str, db: psycopg.Connection[Any], lease: str) -> None:
    app, log = build(dsn, "skip", lease)
    ids = [app.enqueue("step", {"account": "a", "n": i, "fail": i == 1}) for i in range(4)]
    drain(app, concurrency=2)
    assert states(db, ids) == ["done", "failed", "done", "done"]
    assert [n for _, n, _ in log] == [0, 1, 1, 2, 3]
    # retried, a skipped job runs again on its own (its sequence is empty now)
    db.execute("UPDATE skiplock.jobs SET args = args - 'fail' WHERE id = %s", [ids[1]])
    app.retry_job(ids[1])
    assert states(db, [ids[1]]) == ["queued"]


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_rule_fail_fails_the_rest_with_a_reason(dsn: str, db: psycopg.Connection[Any], lease: str) -> None:
    app, log = build(dsn, "fail", lease)
    ids = [app.enqueue("step", {"account": "a", "n": i, "fail": i == 1}) for i in range(4)]
    other = app.enqueue("step", {"account": "b", "n": 0})
    drain(app, concurrency=2)
    assert states(db, ids + [other]) == ["done", "failed", "failed", "failed", "done"]
    assert [n for acc, n, _ in log if acc == "a"] == [0, 1, 1]
    job = app.get_job(ids[2])
    assert job.last_error == f"sequence a: job {ids[1]} before it failed"
    assert job.attempts == 0
    assert db.execute("SELECT count(*) FROM skiplock.job_sequences").fetchone()[0] == 0
    # a later job of the sequence starts a new one
    later = app.enqueue("step", {"account": "a", "n": 5})
    assert states(db, [later]) == ["queued"]


def test_cancelling_a_blocked_job_takes_it_out_of_its_sequence(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, log = build(dsn)
    ids = [app.enqueue("step", {"account": "a", "n": i}) for i in range(3)]
    assert app.cancel_job(ids[1]) == skiplock.JobState.CANCELLED
    drain(app)
    assert states(db, ids) == ["done", "cancelled", "done"]
    assert [n for _, n, _ in log] == [0, 2]


def test_cancelling_the_queued_head_promotes_the_next(dsn: str, db: psycopg.Connection[Any]) -> None:
    app, _ = build(dsn)
    ids = [app.enqueue("step", {"account": "a", "n": i}) for i in range(2)]
    app.cancel_job(ids[0])
    assert states(db, ids) == ["cancelled", "queued"]


def test_a_rollback_of_the_head_leaves_the_order_alone(dsn: str, db: psycopg.Connection[Any]) -> None:
    # the transaction lease: a head's finishing write and its promotion of the next are one transaction
    app, _ = build(dsn)
    ids = [app.enqueue("step", {"account": "a", "n": i}) for i in range(2)]
    with psycopg.connect(dsn) as c:
        c.execute("UPDATE skiplock.jobs SET state = 'done', finished_at = now() WHERE id = %s", [ids[0]])
        assert c.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [ids[1]]).fetchone()[0] == "queued"
        c.rollback()
    assert states(db, ids) == ["queued", "blocked"]


def test_bad_sequence_options_are_refused(dsn: str) -> None:
    app = skiplock.App(dsn)
    with pytest.raises(ConfigurationError, match="sequence_on_failure must be one of wait, skip, fail"):
        app.task("x", sequence_by="a", sequence_on_failure="later")
    with pytest.raises(ConfigurationError, match="sequence_by must be the name of a job argument"):
        app.task("x", sequence_by="")

    @app.task("seq", sequence_by="account")
    def seq(job, account=None):
        pass

    with pytest.raises(InvalidJob, match="sequenced by argument 'account'"):
        app.enqueue("seq", {})
    with pytest.raises(InvalidJob, match="cannot have a unique_key"):
        app.enqueue("seq", {"account": 1}, unique_key="k")
    with pytest.raises(InvalidJob, match="item 1: .*cannot have a unique_key"):
        app.enqueue_many([("other", {}), ("other", {}, {"sequence": "s", "unique_key": "k"})])
    with pytest.raises(InvalidJob, match="a batch with unique keys cannot hold jobs with a sequence"):
        app.enqueue_many([("other", {}, {"unique_key": "k"}), ("other", {}, {"sequence": "s"})])
    with pytest.raises(InvalidJob, match="sequence"):
        app.enqueue("other", {}, sequence="")
    app.close()


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_the_asyncio_worker_keeps_sequences_too(dsn: str, db: psycopg.Connection[Any], lease: str) -> None:
    import asyncio

    aapp = skiplock.AsyncApp(dsn)
    log: list[tuple[str, int]] = []

    @aapp.task("astep", sequence_by="account", lease=lease, max_attempts=3, retry=0)
    async def astep(job, account, n):
        log.append((account, n))
        await asyncio.sleep(0.01)
        if n == 2 and job.attempt == 1:
            raise RuntimeError("once")

    async def main() -> None:
        await aapp.enqueue_many([("astep", {"account": a, "n": n}) for n in range(5) for a in ("x", "y")])
        await asyncio.wait_for(aapp.run_async_worker(concurrency=8, max_connections=4, stop_when_empty=True), 60)

    asyncio.run(main())
    for account in ("x", "y"):
        assert [n for a, n in log if a == account] == [0, 1, 2, 2, 3, 4]
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done'").fetchone()[0] == 0
    aapp.app.close()
