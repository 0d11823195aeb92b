"""worker/queue_view.py: which queues a worker of every queue names while one is paused, and when
it reads them again (sans I/O: the reads themselves are tests/integration/test_paused_queue_view.py)."""

from __future__ import annotations

from skiplock.worker.queue_view import QueueView


def test_it_names_the_queues_with_jobs_that_are_not_paused_only_while_one_is_paused():
    view = QueueView(most=3)
    assert view.named is None  # before any read: every queue
    assert view.update([], []) is None  # nothing paused (the read does not list queues then)
    assert view.update(["p"], ["a", "b", "p"]) == ["a", "b"]
    assert view.named == ["a", "b"]
    assert view.update(["p"], ["p"]) is None  # only the paused queue has jobs: naming none is no claim
    assert view.update(["p"], ["a", "b", "c", "p"]) is None  # more than `most` (the read stops past it)
    assert view.update(["p", "q"], ["a", "b", "q"]) == ["a", "b"]
    assert view.update([], []) is None  # resumed
    assert view.reads == 6


def test_one_read_per_refresh_interval():
    now = [100.0]
    view = QueueView(refresh=1.0, clock=lambda: now[0])
    assert view.take_read()  # never read: the first claim reads
    assert not view.take_read()  # taken: the next claims meanwhile do not read too
    view.update(["p"], ["a", "p"])
    now[0] += 0.99
    assert not view.take_read()
    now[0] += 0.02
    assert view.take_read()
    assert not view.take_read()
