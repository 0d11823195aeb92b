"""Batch-mates side by side (worker/side_by_side.py): the jobs of one claim start together on the
worker's idle slots, inside the claim's one transaction; handlers that touch the database take turns
on its connection, each in its own savepoint; never more than ``concurrency`` handlers at once; a
batch's budget still releases the jobs it has not started."""

from __future__ import annotations

import threading
import time

import pytest

from skiplock.worker.batching import WholeBatches
from support import wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, xact xid8 NOT NULL)")
    return db


class Running:
    """What the handlers did: per job (start, end, thread name, first database use), and the most
    handlers that ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.runs: dict[int, dict] = {}

    def enter(self, job_id: int) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.runs[job_id] = {"start": time.monotonic(), "thread": threading.current_thread().name}

    def leave(self, job_id: int) -> None:
        with self.lock:
            self.now -= 1
            self.runs[job_id]["end"] = time.monotonic()


def start_worker(app, concurrency: int, policy) -> tuple:
    worker = app.worker(concurrency=concurrency, handle_signals=False, maintenance=False, batch_policy=policy,
                        poll_interval=5.0)  # a NOTIFY wakes them: no poll takes part of a burst
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # every slot idle, waiting for a wake-up: the claim a NOTIFY starts sees them all
    wait_for(lambda: worker.started.is_set() and worker._sleeping == concurrency, what="every slot idle")
    return worker, thread


def stop(worker, thread) -> None:
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()


def batches_of(db, ids) -> list[list[int]]:
    """Jobs grouped by the transaction that wrote them done."""
    rows = db.execute("SELECT xmin::text, array_agg(id ORDER BY id) FROM skiplock.jobs WHERE id = ANY(%s) "
                      "GROUP BY 1 ORDER BY 2", [ids]).fetchall()
    return [r[1] for r in rows]


def all_done(db, ids) -> bool:
    return db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                      [ids]).fetchone()[0] == len(ids)


def nap_task(app, running: Running, seconds: float) -> None:
    """Registers ``nap``: a task that naps ``seconds``, recorded in ``running``."""

    @app.task(name="nap")
    def nap(job):
        running.enter(job.id)
        time.sleep(seconds)
        running.leave(job.id)


def hold_task(app) -> threading.Event:
    """Registers ``hold``: a task that waits (at most 30 s) until the event returned is set."""
    release = threading.Event()

    @app.task(name="hold")
    def hold(job):
        release.wait(30)
    return release


def naps(app, db, running: Running, seconds: float, jobs: int, concurrency: int) -> list[int]:
    """``jobs`` jobs of a task that naps ``seconds`` (recorded in ``running``), run by a worker of
    ``concurrency`` slots whose claims take 8 jobs side by side; their ids once all are done."""
    nap_task(app, running, seconds)
    worker, thread = start_worker(app, concurrency, WholeBatches(8, batch_budget=30, side_by_side=True))
    try:
        ids = app.enqueue_many([("nap", {})] * jobs)
        wait_for(lambda: all_done(db, ids), what="every job done")
    finally:
        stop(worker, thread)
    return ids


def test_batch_mates_start_together_on_idle_slots_in_one_transaction(app, db):
    running = Running()
    ids = naps(app, db, running, seconds=0.5, jobs=8, concurrency=8)
    assert batches_of(db, ids) == [ids]  # one claim, one COMMIT
    runs = [running.runs[i] for i in ids]
    # all eight at once: each started before any of them ended (one after another: 4 s)
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs)
    assert len({r["thread"] for r in runs}) == 8 and running.most == 8
    assert db.execute("SELECT count(*) FROM skiplock.job_batches").fetchone()[0] == 0


def test_side_by_side_handlers_take_turns_on_the_connection_and_a_failure_undoes_only_its_own(app, db, effects):
    running = Running()
    used: dict[int, tuple[float, float]] = {}  # writer -> (first database use, end)

    @app.task(name="mixed", max_attempts=1)
    def mixed(job, write, fail):
        running.enter(job.id)
        try:
            if write:
                job.conn.execute("INSERT INTO effects VALUES (%s, pg_current_xact_id())", [job.id])
                began = time.monotonic()
                time.sleep(0.3)  # holding the connection: no other writer may use it meanwhile
                used[job.id] = (began, time.monotonic())
                if fail:
                    raise RuntimeError("this writer fails after its insert")
            else:
                time.sleep(0.3)
        finally:
            running.leave(job.id)

    worker, thread = start_worker(app, 8, WholeBatches(8, batch_budget=30, side_by_side=True))
    try:
        spec = [(True, False), (False, False), (True, True), (False, False),
                (True, False), (False, False), (True, False), (False, False)]
        ids = app.enqueue_many([("mixed", {"write": w, "fail": f}) for w, f in spec])
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state IN "
                                    "('done', 'failed')", [ids]).fetchone()[0] == 8, what="the batch finished")
    finally:
        stop(worker, thread)
    states = dict(db.execute("SELECT id, state FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall())
    assert [states[i] for i in ids] == ["done", "done", "failed", "done", "done", "done", "done", "done"]
    rows = effects.execute("SELECT job_id, xact::text FROM effects ORDER BY job_id").fetchall()
    writers = [ids[0], ids[4], ids[6]]
    assert [r[0] for r in rows] == writers  # the failed writer's insert is gone, nobody else's
    assert len({r[1] for r in rows}) == 1  # one transaction: the batch's
    # the writers used the connection one after another, never two at once
    spans = sorted(used.values())
    assert len(spans) == 4
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # while the ones that never touched it ran alongside them
    assert running.most >= 5


def test_never_more_handlers_at_once_than_the_concurrency(app, db):
    running = Running()
    ids = naps(app, db, running, seconds=0.1, jobs=24, concurrency=3)
    assert running.most == 3  # side by side (more than one at once), never more than three
    assert db.execute("SELECT count(*), max(attempts) FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchone() == (24, 1)


def test_jobs_not_started_within_the_budget_are_released_and_run_later(app, db):
    running = Running()

    @app.task(name="long", timeout=30)  # a timed task runs alone: it keeps one slot busy
    def long(job):
        time.sleep(2.5)

    nap_task(app, running, 0.4)
    worker, thread = start_worker(app, 2, WholeBatches(8, batch_budget=0.3, side_by_side=True))
    try:
        busy = app.enqueue("long")
        wait_for(lambda: worker._sleeping == 1, what="one slot busy with the long job")
        ids = app.enqueue_many([("nap", {})] * 4)
        wait_for(lambda: all_done(db, ids + [busy]), what="every job done")
    finally:
        stop(worker, thread)
    # No slot was idle to take a batch-mate, and each job takes longer than the budget: every batch ran
    # one job and released the rest at its COMMIT (not run, not charged).
    assert len(batches_of(db, ids)) == 4
    assert db.execute("SELECT max(attempts) FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchone()[0] == 1
    assert running.most == 1


def test_a_batch_begun_with_no_slot_idle_hands_the_jobs_left_to_a_slot_that_goes_idle(app, db):
    """A batch that found no slot idle when it began runs its jobs one after another on its slot --
    until a slot goes idle: the jobs it has not started then run side by side, the idle slot taking
    them, still in the claim's one transaction. No ready job waits behind its batch-mates while a
    slot sits idle."""
    running = Running()
    release = hold_task(app)
    nap_task(app, running, 0.2)
    worker, thread = start_worker(app, 2, WholeBatches(8, batch_budget=30, side_by_side=True))
    try:
        held = app.enqueue("hold")
        wait_for(lambda: len(worker._busy) == 1 and len(worker._sleepers) == 1, what="one slot busy with the hold job")
        ids = app.enqueue_many([("nap", {})] * 8)  # the other slot claims all eight: no slot idle to hand them to
        wait_for(lambda: len(running.runs) >= 2, what="the batch's second job running")
        release.set()  # the hold job's slot finishes, finds nothing to claim (the batch holds it all) and sleeps
        wait_for(lambda: all_done(db, [held, *ids]), what="every job done")
    finally:
        release.set()
        stop(worker, thread)
    assert batches_of(db, ids) == [ids]  # one claim, one COMMIT
    threads = [running.runs[i]["thread"] for i in ids]
    assert threads[0] == threads[1], threads  # begun one after another on the claiming slot
    assert len(set(threads)) == 2, threads  # then the slot that went idle took some of the jobs left
    assert running.most == 2
    assert worker._helping == 0 and worker._lent == 0


@pytest.mark.parametrize("cap, most", [(8, 8), (4, 4), (1, 1)])
def test_slots_the_lease_limit_holds_back_run_batch_mates_in_place_of_the_leases_it_cut(app, db, cap, most):
    """A slot that finds every governor permit taken (worker/governor.py) waits where a batch can hand
    it jobs: batch-mates run in their claim's transaction, under its lease, and need no permit. As
    many such slots take batch-mates at once as the governor's cut took away (its cap less its
    limit): one lease allowed out of a cap of 8 and a batch of eight still starts all eight at once;
    with a cap of 4, four; with no cut (a worker at its share, the rest parked), one after another."""
    running = Running()
    release_hold = hold_task(app)
    nap_task(app, running, 0.5)
    worker = app.worker(concurrency=8, handle_signals=False, maintenance=False, poll_interval=5.0,
                        batch_policy=WholeBatches(8, batch_budget=30, side_by_side=True), adaptive_limit=False)
    worker.governor.limit, worker.governor.cap = 1, cap  # one lease at a time: a cut from `cap`, held still
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        # one slot took the only permit, found nothing and sleeps; the others found none: held back
        wait_for(lambda: worker.started.is_set() and len(worker._sleepers) == 1 and len(worker._parked) == 7,
                 what="one slot idle, seven held back by the governor")
        held = app.enqueue("hold")  # its slot holds the only permit while it runs
        wait_for(lambda: worker.governor.held == 1 and len(worker._busy) == 1, what="the hold job running")
        wait_for(lambda: len(worker._parked) == 7, what="seven slots held back by the governor")
        ids = app.enqueue_many([("nap", {})] * 8)
        release_hold.set()
        wait_for(lambda: all_done(db, [held, *ids]), what="every job done")
    finally:
        release_hold.set()
        stop(worker, thread)
    assert running.most == most
    if most == 8:
        assert batches_of(db, ids) == [ids]  # one claim, one COMMIT
        runs = [running.runs[i] for i in ids]
        assert max(r["start"] for r in runs) < min(r["end"] for r in runs)  # all eight at once
        assert len({r["thread"] for r in runs}) == 8
    assert worker.governor.held == 0 and worker._helping == 0
