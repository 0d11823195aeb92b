"""A suspect never waits at the run gate holding its transaction (worker/gate.py).

The cycle this guards against, seen in a 2-slot worker after a server restart: slot X's claim kept the
lock of a claimed-lease job's row it had re-checked and skipped (PostgreSQL keeps such a lock to the
end of the transaction), then found a suspect and waited for the gate; slot Y, holding the gate while
it ran that claimed job, waited in its finishing write for X's lock. Here X's leftover lock is taken
by hand in X's lease transaction, the rest is the executor's own path on a real server: X must let
its transaction go at once (``RunAlone``), Y's finishing write then goes through, and X's next claim,
holding the gate alone, runs the suspect with its attempt uncharged."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.worker.executor import Executor
from skiplock.worker.gate import RunAlone

from support import wait_for


def test_a_suspect_lets_its_transaction_go_instead_of_waiting_for_the_gate(app: skiplock.App, db: psycopg.Connection):
    handler_in, release = threading.Event(), threading.Event()

    @app.task("claimed", lease="claimed", lease_seconds=60)
    def claimed(job: Any) -> None:
        handler_in.set()
        release.wait(60)

    @app.task("plain")
    def plain(job: Any) -> str:
        return "ran"

    j1 = app.enqueue("claimed")
    suspect = app.enqueue("plain")
    # a batch that never committed listed it: its next attempt must run alone (start_attempt)
    db.execute("INSERT INTO skiplock.job_batches (ids, worker, backend_pid) VALUES (ARRAY[%s]::bigint[], 'gone', 0)",
               [suspect])
    backend = app.backend
    executor = Executor(app, "w", slots=2)
    stopping = threading.Event()
    lease_y, lease_x = backend.connect_lease("y"), backend.connect_lease("x")
    results: dict[str, Any] = {}

    def slot_y() -> None:
        with executor.gate.shared():  # as the slot loop holds it, from its claim to its COMMIT
            lease_y.begin()
            got = backend.claim(lease_y, None, 1, tasks=["claimed"])
            results["y"] = executor.run_batch(lease_y, got, "w/y", 1.0, stopping).outcomes

    def slot_x() -> None:
        with executor.gate.shared():
            lease_x.begin()
            # the claim's leftover lock on a row it re-checked and skipped: Y's running job
            lease_x.conn.execute("SELECT 1 FROM skiplock.jobs WHERE id = %s FOR UPDATE", [j1])
            got = backend.claim(lease_x, None, 1, tasks=["plain"])
            assert [c.id for c in got] == [suspect]
            try:
                executor.run_batch(lease_x, got, "w/x", 1.0, stopping)
            except RunAlone as ran_alone:
                results["x"] = ran_alone

    try:
        y = threading.Thread(target=slot_y)
        y.start()
        assert handler_in.wait(30)
        x = threading.Thread(target=slot_x)
        x.start()
        x.join(30)
        assert not x.is_alive(), "the slot with the suspect waited for the gate"
        assert isinstance(results.get("x"), RunAlone) and results["x"].job_id == suspect
        assert not lease_x.in_transaction()  # its locks went with it: Y's job row is free again
        release.set()
        y.join(30)
        assert not y.is_alive(), "the claimed job's finishing write never went through"
        assert db.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [j1]).fetchone()[0] == "done"
        row = db.execute("SELECT state, attempts FROM skiplock.jobs WHERE id = %s", [suspect]).fetchone()
        assert row == ("queued", 0)  # let go untouched

        # The slot's next claim holds the gate alone: the suspect runs now, its first attempt uncharged.
        with executor.gate.exclusive():
            lease_x.begin()
            got = backend.claim(lease_x, None, 1, tasks=["plain"])
            assert [c.id for c in got] == [suspect]
            outcomes = executor.run_batch(lease_x, got, "w/x", 1.0, stopping).outcomes
        assert [type(o).__name__ for o in outcomes] == ["Done"]
        assert db.execute("SELECT state, attempts, result FROM skiplock.jobs WHERE id = %s",
                          [suspect]).fetchone() == ("done", 1, "ran")
    finally:
        release.set()
        executor.close()
        lease_x.close()
        lease_y.close()


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "single"])
def test_a_worker_with_a_suspect_and_busy_slots_drains(app: skiplock.App, db: psycopg.Connection, batched: bool):
    """The whole slot loop: 2 slots, claimed-lease jobs and transaction-lease ones, one of them a
    suspect; every job ends done, the suspect's attempt uncharged."""
    @app.task("claimed", lease="claimed", lease_seconds=60)
    def claimed(job: Any) -> None:
        pass

    @app.task("plain")
    def plain(job: Any) -> None:
        pass

    ids = app.enqueue_many([("plain" if i % 2 else "claimed", {}) for i in range(200)])
    suspect = ids[11]
    db.execute("INSERT INTO skiplock.job_batches (ids, worker, backend_pid) VALUES (ARRAY[%s]::bigint[], 'gone', 0)",
               [suspect])
    worker = app.worker(concurrency=2, batch_size=8 if batched else 1)
    stats = worker.run(stop_when_empty=True)
    assert stats.done == 200
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0] == 200
    assert db.execute("SELECT attempts FROM skiplock.jobs WHERE id = %s", [suspect]).fetchone()[0] == 1
