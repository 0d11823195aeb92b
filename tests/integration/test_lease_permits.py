"""Which slots hold the governor's permits (worker/governor.py, worker/loop.py ``_idle`` and
``_park``): a slot that goes idle gives its permit back as it sleeps, and the next work goes to such
a slot, whose session is open -- a slot the governor held back never opens a session of its own to
claim what a warm slot would have."""

from __future__ import annotations

import threading
import time

from skiplock.worker.batching import WholeBatches
from support import wait_for


def counting_leases(app) -> list[str]:
    """Every lease session the worker opens, by slot name (the real connection, counted)."""
    opened: list[str] = []
    connect = app.backend.connect_lease

    def counted(name: str):
        opened.append(name)
        return connect(name)

    app.backend.connect_lease = counted
    return opened


def done(db, ids) -> bool:
    return db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                      [ids]).fetchone()[0] == len(ids)


def two_permits(app, concurrency: int, **options):
    """A worker of ``concurrency`` slots whose governor allows two leases, held still."""
    worker = app.worker(concurrency=concurrency, handle_signals=False, maintenance=False, poll_interval=5.0,
                        adaptive_limit=False, **options)
    worker.governor.limit = worker.governor.cap = 2
    return worker


def test_idle_slots_keep_the_permits_and_held_back_slots_open_no_session(app, db):
    @app.task(name="t")
    def t(job):
        time.sleep(0.3)  # long enough for the held-back slots to look for a permit while an idle one helps

    opened = counting_leases(app)
    # claims of up to 8 jobs, run side by side on idle slots
    worker = two_permits(app, concurrency=8, batch_policy=WholeBatches(8, batch_budget=30, side_by_side=True))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.started.is_set() and len(worker._sleepers) == 2 and len(worker._parked) == 6,
                 what="two slots idle with the permits given back, six held back")
        for _ in range(3):  # bursts, each followed by a quiet spell the held-back slots wake up in
            # one slot claims them, the other idle one runs batch-mates beside it (side_by_side.py)
            ids = app.enqueue_many([("t", {})] * 4)
            wait_for(lambda: done(db, ids), what="the burst done")
            time.sleep(1.2)  # longer than a held-back slot's wait: each looked for a permit again
        assert worker.governor.held == 0  # both permits free...
        assert len(worker._parked) == 6   # ...and still no held-back slot took one
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert len(set(opened)) == 2, opened  # two sessions in all: the slots that held the permits


def test_a_worker_that_stops_when_empty_opens_no_session_for_its_held_back_slots(app, db):
    @app.task(name="t")
    def t(job):
        pass

    ids = app.enqueue_many([("t", {})] * 40)
    opened = counting_leases(app)
    stats = two_permits(app, concurrency=16).run(stop_when_empty=True)
    assert done(db, ids) and stats.done == 40
    # the slots held back never claimed: once a claim found none left they stop as well, instead of
    # each opening a session to find the same
    assert len(set(opened)) <= 2, opened
