"""Batch turns (worker/batching.py ``Turns``, worker/loop.py): near-instant batches take turns, and a
turn given back goes to the slot that gave one back last -- so a worker of many slots drains such jobs
on the few slots (threads and sessions) that take turns, not round every slot."""

from __future__ import annotations

import threading
from collections import Counter

from skiplock.worker.batching import WholeBatches
from support import wait_for


def test_near_instant_batches_are_claimed_by_the_few_slots_that_take_turns(app, db):
    @app.task(name="t")
    def t(job):
        pass

    claimers: list[int] = []  # the lease (one per slot) of every claim that took jobs
    claim = app.backend.claim

    def counted(lease, *args, **kwargs):
        got = claim(lease, *args, **kwargs)
        if got:
            claimers.append(id(lease))
        return got

    app.backend.claim = counted
    worker = app.worker(concurrency=16, handle_signals=False, maintenance=False, poll_interval=5.0,
                        adaptive_limit=False, batch_policy=WholeBatches(8, batch_slots=1))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.started.is_set() and len(worker._sleepers) == 16, what="every slot idle")
        ids = app.enqueue_many([("t", {})] * 800)
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                                    [ids]).fetchone()[0] == len(ids), what="every job done")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert len(claimers) >= 100  # a hundred batches of 8
    # one slot claims while another commits (its turn given back before the COMMIT); a third joins
    # while a COMMIT takes longer than a batch. Round every slot (first come, first served), each of the
    # 16 took about a sixteenth of the batches.
    # (measured: the four busiest took all 100 alone; 68 of 100 with two more test processes on the
    # machine, its COMMITs slower; first come, first served, 29-34 of them)
    busiest = sum(n for _, n in Counter(claimers).most_common(4))
    assert busiest >= 0.5 * len(claimers), Counter(claimers).most_common()
