"""LISTEN/NOTIFY wake-ups (a hint, recovered by polling) and batched claims (still exactly once)."""

from __future__ import annotations

import threading
import time

import pytest

from test_worker import record, wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, slot text NOT NULL)")
    return db


def running(worker):
    thread = threading.Thread(target=worker.run)
    thread.start()
    worker.started.wait(10)
    return thread


def test_notify_wakes_an_idle_worker_long_before_its_poll(app, effects):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=2, poll_interval=60, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        assert worker.listener.listening.wait(10)
        wait_for(lambda: len(worker._leases) == 2)  # both slots connected, polled once, now idle for 60 s
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done", timeout=20)  # poll interval is 60 s
        assert worker.listener.notifications >= 1
    finally:
        worker.stop()
        thread.join(30)


def test_without_notify_polling_still_finds_jobs(app, effects):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=1, poll_interval=0.05, handle_signals=False, maintenance=False, listen=False)
    thread = running(worker)
    try:
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done")
        assert worker.listener is None
    finally:
        worker.stop()
        thread.join(30)


def test_a_killed_listener_reconnects_and_relistens(app, effects, db):
    app.task(name="effect")(record)
    worker = app.worker(concurrency=1, poll_interval=60, handle_signals=False, maintenance=False)
    thread = running(worker)
    try:
        listeners = "SELECT pid FROM pg_stat_activity WHERE application_name = 'skiplock-listener' AND datname = current_database()"
        wait_for(lambda: db.execute(listeners).fetchall())
        db.execute(f"SELECT pg_terminate_backend(pid) FROM ({listeners}) l")
        wait_for(lambda: worker.listener.reconnects >= 1)
        wait_for(lambda: db.execute(listeners).fetchall())
        job_id = app.enqueue("effect")
        wait_for(lambda: app.get_job(job_id).state == "done", timeout=20)
    finally:
        worker.stop()
        thread.join(30)


def test_a_wake_up_that_comes_while_a_slot_is_claiming_is_not_lost(app):
    """A NOTIFY that arrives while the slot is still in its (empty) claim finds nobody waiting on the
    wake-up condition; the slot must not then sleep a whole poll interval through it (its job may
    have committed after the claim's snapshot). Seen as a 20 s timeout of the killed-listener test
    above on a loaded machine: the listener's reconnect woke the slot, the test's job was enqueued
    while that claim ran, and the slot slept for its 60 s poll."""
    worker = app.worker(concurrency=1, poll_interval=60, handle_signals=False, maintenance=False)
    since = worker._wakes  # the slot begins a claim ...
    worker.wake(every=False)  # ... and a wake-up arrives meanwhile, with no slot waiting
    returned = threading.Event()
    threading.Thread(target=lambda: (worker._idle(since), returned.set()), daemon=True).start()
    assert returned.wait(10), "the slot slept through a wake-up that came while it was claiming"
    worker.stop()


def test_batched_claims_drain_exactly_once(app, effects):
    app.task(name="effect")(record)
    ids = app.enqueue_many([("effect", {})] * 1000)
    stats = app.worker(concurrency=4, batch_size=20, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert stats.done == 1000
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id").fetchall())
    assert per_job == {i: 1 for i in ids}



def test_a_wake_up_a_sleeping_slot_took_does_not_send_the_busy_ones_claiming_again(app):
    """A NOTIFY that woke an idle slot is that slot's to serve: a slot that was busy meanwhile (it
    began its claim before the wake-up) goes to sleep after its batch instead of claiming again for
    it -- each such claim found nothing (measured: half of all claims at 1 ms jobs offered at half
    the capacity). An unserved one still sends it claiming (the test above)."""
    worker = app.worker(concurrency=2, poll_interval=60, handle_signals=False, maintenance=False)
    woken = threading.Event()
    sleeper = threading.Thread(target=lambda: (worker._idle(worker._wakes), woken.set()), daemon=True)
    sleeper.start()
    wait_for(lambda: worker._sleeping == 1)
    since = worker._wakes  # the busy slot begins its claim ...
    worker.wake(every=False)  # ... a NOTIFY comes, and the sleeping slot takes it
    assert woken.wait(10)
    returned = threading.Event()
    busy = threading.Thread(target=lambda: (worker._idle(since), returned.set()), daemon=True)
    busy.start()
    wait_for(lambda: worker._sleeping == 1)  # the busy slot sleeps: nothing was left unserved
    assert not returned.is_set()
    worker.wake(every=False)  # (ends the test's sleep)
    assert returned.wait(10)
    worker.stop()


class _Listening:
    """Stands in for a worker's listener whose session is up (``Worker._listening``)."""

    def __init__(self) -> None:
        self.listening = threading.Event()
        self.listening.set()


def _sleep_in_turn(worker, name: str, log: list[str], stop: threading.Event) -> threading.Thread:
    """A slot's idle loop: sleep (``_idle``), note each return as a poll or a wake-up, sleep again."""
    def loop() -> None:
        while not stop.is_set():
            worker._idle(worker._wakes)
            log.append(name)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_a_wake_up_goes_to_the_slot_that_went_idle_last(app):
    """Last in, first out: a light load stays on the few slots (and sessions) that just served it,
    whose prepared statements keep their plans, instead of going round every slot's session."""
    worker = app.worker(concurrency=3, poll_interval=60, handle_signals=False, maintenance=False)
    woken: list[str] = []
    threads = []
    for i, name in enumerate("abc"):
        t = threading.Thread(target=lambda n=name: (worker._idle(worker._wakes), woken.append(n)), daemon=True)
        t.start()
        threads.append(t)
        wait_for(lambda: worker._sleeping == i + 1)
    worker.wake(every=False)
    wait_for(lambda: woken == ["c"])
    worker.wake(every=False, slots=2)
    wait_for(lambda: sorted(woken) == ["a", "b", "c"])
    assert woken[0] == "c"
    worker.stop()


def test_with_a_listener_up_only_the_slot_that_went_idle_last_polls(app):
    """Idle slots do not all poll: NOTIFYs announce new jobs, so one slot (the warmest) polls for
    what none announces. Before, every idle slot claimed every poll interval: 2 processes x 32
    slots made 129 empty claims a second."""
    worker = app.worker(concurrency=3, poll_interval=0.02, handle_signals=False, maintenance=False)
    worker.listener = _Listening()
    log: list[str] = []
    stop = threading.Event()
    first = _sleep_in_turn(worker, "first", log, stop)
    wait_for(lambda: worker._sleeping == 1)
    second = _sleep_in_turn(worker, "second", log, stop)  # idle after "first": it polls
    wait_for(lambda: log.count("second") >= 10)
    assert "first" not in log
    worker.listener.listening.clear()  # no listener: polling is all each slot has
    wait_for(lambda: "first" in log)
    stop.set()
    worker.stop()
    first.join(10)
    second.join(10)


def test_an_idle_worker_with_a_listener_claims_about_once_per_poll_interval(app):
    """Eight idle slots polling every 50 ms made about 160 empty claims a second; one poller
    makes about 20 (and NOTIFYs still wake the others: the tests above)."""
    app.task(name="noop")(lambda job: None)
    worker = app.worker(concurrency=8, poll_interval=0.05, handle_signals=False, maintenance=False)
    claims = []
    claim = worker.claimer.claim

    def counted(*args, **kwargs):
        claims.append(1)
        return claim(*args, **kwargs)
    worker.claimer.claim = counted
    thread = running(worker)
    try:
        assert worker.listener.listening.wait(10)
        wait_for(lambda: len(worker._leases) == 8 and worker._sleeping == 8)  # all connected and idle
        before = len(claims)
        time.sleep(1.0)
        made = len(claims) - before
        assert 1 <= made <= 60, made  # one slot every 50 ms (two at most while it hands over)
        job_id = app.enqueue("noop")
        wait_for(lambda: app.get_job(job_id).state == "done", timeout=20)
    finally:
        worker.stop()
        thread.join(30)


def test_an_unserved_wake_up_sends_one_busy_slot_claiming_not_every_one(app):
    """A NOTIFY that came while every slot was busy is served by the next claim that begins -- its
    snapshot is taken after the wake-up, so it sees the job --, or else by the first slot that would
    go to sleep: it claims instead. The other busy slots sleep: their claims again used to find
    nothing (with 1 ms jobs at half the capacity, a sixth of all claims)."""
    worker = app.worker(concurrency=2, poll_interval=60, handle_signals=False, maintenance=False)
    since = worker._wakes  # both slots begin claims ...
    worker.wake(every=False, slots=2)  # ... and a NOTIFY comes, with no slot waiting
    first, second = threading.Event(), threading.Event()
    threading.Thread(target=lambda: (worker._idle(since), first.set()), daemon=True).start()
    assert first.wait(10), "no slot claimed for the unserved wake-up"
    threading.Thread(target=lambda: (worker._idle(since), second.set()), daemon=True).start()
    wait_for(lambda: worker._sleeping == 1)  # the other one sleeps: the wake-up was served
    assert not second.is_set()
    worker.wake(every=False, slots=3)  # wakes the sleeper; unserved for the rest ...
    assert second.wait(10)
    worker._claim_begins()  # ... until a claim begins: it serves them
    third = threading.Event()
    threading.Thread(target=lambda: (worker._idle(since), third.set()), daemon=True).start()
    wait_for(lambda: worker._sleeping == 1)
    assert not third.is_set()
    worker.wake()  # a wake-up of every slot: each claims before it sleeps
    assert third.wait(10)
    done = threading.Event()
    threading.Thread(target=lambda: (worker._idle(since), done.set()), daemon=True).start()
    assert done.wait(10)
    worker.stop()


def test_a_full_claim_sleeps_after_its_batch_once_a_later_claim_found_every_job(app):
    """A claim that came back full claims again after its batch -- there may be more -- unless a
    claim that began after it came back short: that one found every available job, and anything
    since comes with a NOTIFY. Without a listener it always claims again."""
    worker = app.worker(concurrency=4, poll_interval=60, handle_signals=False, maintenance=False)
    worker.listener = _Listening()
    wakes = worker._wakes
    full, later, latest = next(worker._claims), next(worker._claims), next(worker._claims)
    assert not worker._drained(full, wakes, 8, 8)  # full, and nothing known since: claim again
    assert worker._drained(full, wakes, 3, 8)  # short: it found every job itself
    worker._found_all(later)
    assert worker._drained(full, wakes, 8, 8)  # a later claim found every job
    assert not worker._drained(latest, wakes, 8, 8)  # ... but not after this one began
    worker.listener.listening.clear()
    assert not worker._drained(full, wakes, 8, 8) and not worker._drained(full, wakes, 3, 8)
    worker.stop()


def test_jobs_offered_while_every_slot_is_busy_are_all_run_exactly_once_without_polling(app, effects):
    """The wake-up rules above end to end: jobs enqueued one at a time and in bursts, most while both
    slots are busy (their NOTIFYs find nobody sleeping), claimed by slots that go to sleep whenever a
    claim found every job; the poll interval is a minute, so a job these rules left unclaimed would
    wait past the test's timeout. (Which rule serves which job depends on timing: the exact cases are
    the tests above.)"""
    def slow_effect(job):
        time.sleep(0.01)
        record(job)
    app.task(name="effect")(slow_effect)
    worker = app.worker(concurrency=2, poll_interval=60, batch_size=4, handle_signals=False, maintenance=False)
    thread = running(worker)
    ids: list[int] = []
    try:
        assert worker.listener.listening.wait(10)
        for burst in range(60):
            ids += app.enqueue_many([("effect", {})] * (1 + (burst % 7 == 0) * 5))
            time.sleep(0.003)
        wait_for(lambda: effects.execute("SELECT count(*) FROM effects").fetchone()[0] >= len(ids), timeout=30)
    finally:
        worker.stop()
        thread.join(30)
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id").fetchall())
    assert per_job == {i: 1 for i in ids}
