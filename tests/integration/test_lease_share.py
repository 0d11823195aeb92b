"""A worker's share of leases (worker/governor.py ``share``, fed by worker/presence.py): processes
that claim from the same database split the leases of fast jobs between them."""

from __future__ import annotations

import threading
import uuid

from support import wait_for


def test_a_worker_takes_its_share_from_the_live_workers_and_a_bigger_one_when_they_go(app):
    others = [uuid.uuid4() for _ in range(3)]
    for i, other in enumerate(others):  # three other live worker processes, as their presence rows say
        app.backend.worker_seen(other, f"elsewhere:{i}", ["t"], None, host="elsewhere", pid=i, concurrency=8)

    @app.task(name="t")
    def t(job):
        pass

    worker = app.worker(concurrency=40, handle_signals=False)
    assert worker.governor.cap == 16  # alone: the whole start
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.started.wait(10)
        wait_for(lambda: worker.governor.cap == 4, timeout=30, what="a quarter of 16 leases (4 live workers)")
        for other in others:
            app.backend.worker_gone(other)
        wait_for(lambda: worker.governor.cap == 16, timeout=40, what="the whole start once alone again")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
