"""Periodic jobs: exactly one job per tick however many schedulers run, missed-tick policies, zones."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import skiplock
from skiplock.maintenance.periodic import Schedule, Scheduler
from support import wait_for

T0 = datetime(2026, 11, 30, 12, 0, 30, tzinfo=timezone.utc)


def make_app(dsn: str, missed: str = "skip") -> skiplock.App:
    app = skiplock.App(dsn)

    @app.periodic("*/5 * * * *", name="report", args={"kind": "daily"}, missed=missed)
    def report(job, kind):
        return kind

    return app


def test_ten_schedulers_on_one_tick_enqueue_exactly_one_job(dsn, db):
    apps = [make_app(dsn) for _ in range(10)]
    schedulers = [Scheduler(a, clock=lambda: T0) for a in apps]
    for s in schedulers:
        s.catch_up(T0)
    tick = datetime(2026, 11, 30, 12, 5, tzinfo=timezone.utc)
    barrier = threading.Barrier(len(schedulers))
    results: list[list[int]] = []

    def fire(s: Scheduler) -> None:
        barrier.wait()
        results.append(s.run_due(tick + timedelta(milliseconds=1)))

    threads = [threading.Thread(target=fire, args=(s,)) for s in schedulers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r) for r in results) == [0] * 9 + [1]
    rows = db.execute("SELECT task, args FROM skiplock.jobs").fetchall()
    assert rows == [("report", {"kind": "daily"})]
    assert db.execute("SELECT schedule, tick FROM skiplock.periodic_ticks").fetchall() == [("report", tick)]
    for a in apps:
        a.close()


def test_each_tick_once_over_time_and_nothing_before_it_is_due(dsn, db):
    app = make_app(dsn)
    s = Scheduler(app)
    s.catch_up(T0)
    assert s.run_due(T0 + timedelta(minutes=4)) == []  # 12:05 not yet due
    assert len(s.run_due(T0 + timedelta(minutes=4, seconds=31))) == 1  # 12:05:01
    assert s.run_due(T0 + timedelta(minutes=5)) == []  # same tick again: nothing
    assert len(s.run_due(T0 + timedelta(minutes=9, seconds=31))) == 1  # 12:10
    ticks = [r[0].minute for r in db.execute("SELECT tick FROM skiplock.periodic_ticks ORDER BY tick")]
    assert ticks == [5, 10]
    app.close()


def test_missed_ticks_are_skipped_by_default_and_run_once_on_request(dsn, db):
    first = make_app(dsn)
    s = Scheduler(first)
    s.catch_up(T0)
    s.run_due(T0 + timedelta(minutes=5))  # tick 12:05 enqueued, then "no worker runs" for an hour
    first.close()
    later = T0 + timedelta(hours=1)  # 13:00:30: ticks 12:10 ... 13:00 were missed

    skipper = make_app(dsn, missed="skip")
    Scheduler(skipper).catch_up(later)
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1
    skipper.close()

    catcher = make_app(dsn, missed="run_once")
    Scheduler(catcher).catch_up(later)
    Scheduler(catcher).catch_up(later)  # a second scheduler starting: still one catch-up job
    ticks = [r[0] for r in db.execute("SELECT tick FROM skiplock.periodic_ticks ORDER BY tick")]
    assert ticks == [datetime(2026, 11, 30, 12, 5, tzinfo=timezone.utc), datetime(2026, 11, 30, 13, 0, tzinfo=timezone.utc)]
    catcher.close()


def test_time_zones_follow_local_wall_clock():
    paris = Schedule.create("x", "0 9 * * *", "{}", "Europe/Paris", "skip")
    winter = paris.next_after(datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc))
    summer = paris.next_after(datetime(2026, 7, 1, 0, 0, tzinfo=timezone.utc))
    assert (winter.hour, summer.hour) == (8, 7)  # 09:00 in Paris is 08:00 UTC in winter, 07:00 in summer


def test_a_worker_runs_the_scheduler_and_the_periodic_job(dsn, db):
    app = skiplock.App(dsn)

    @app.periodic("* * * * *", name="every_minute", missed="run_once")
    def every_minute(job):
        return "ran"

    db.execute("INSERT INTO skiplock.periodic_ticks (schedule, tick) VALUES ('every_minute', now() - interval '1 hour')")
    worker = app.worker(concurrency=1, poll_interval=0.02, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.started.wait(30)
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE task = 'every_minute' "
                                    "AND state = 'done'").fetchone()[0], 30, "the periodic job to run")
    finally:
        worker.stop()
        thread.join(30)
    assert db.execute("SELECT result FROM skiplock.jobs WHERE task = 'every_minute'").fetchone()[0] == "ran"
    app.close()


def test_a_periodic_task_declared_with_the_claimed_lease_runs_as_a_claimed_lease_job(dsn, db):
    app = skiplock.App(dsn)
    seen = {}

    @app.periodic("*/5 * * * *", name="export", missed="run_once", lease="claimed", lease_seconds=30)
    def export(job):
        # another session sees the claim committed: running, owned, leased -- no transaction held
        seen["row"] = db.execute("SELECT state, owner IS NOT NULL, lease_expires_at > now() FROM skiplock.jobs "
                                 "WHERE id = %s", [job.id]).fetchone()
        return "exported"

    assert (app.tasks["export"].lease, app.tasks["export"].lease_seconds) == ("claimed", 30.0)
    db.execute("INSERT INTO skiplock.periodic_ticks (schedule, tick) VALUES ('export', %s)", [T0 - timedelta(hours=1)])
    scheduler = Scheduler(app)
    scheduler.catch_up(T0)  # run_once: the 12:00 tick, missed
    [(_, tick, job_id)] = scheduler.enqueued
    assert tick == datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    stats = app.worker(concurrency=1, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert stats.done == 1 and seen["row"] == ("running", True, True)
    job = app.get_job(job_id)
    assert (job.state, job.result, job.lease_expires_at) == ("done", "exported", None)
    app.close()


def test_periodic_task_options_are_checked_at_decoration_time():
    import pytest

    app = skiplock.App("dbname=unused")  # nothing connects
    for options, message in [({"lease": "forever"}, "lease must be"), ({"lease_seconds": 0.5}, "lease_seconds must be"),
                             ({"timeout": -1}, "timeout must be")]:
        with pytest.raises(skiplock.ConfigurationError, match=message):
            app.periodic("* * * * *", name="x", **options)
    assert app.tasks == {} and app.schedules == {}


def test_the_running_scheduler_decides_its_fires_from_the_injected_clock(dsn, db):
    """The scheduler service on a ManualClock: it waits exactly until the next tick (computed from the
    clock, not from time passing), fires at it, and not a moment before -- with no sleeping."""
    from skiplock.lifecycle import ManualClock

    app = make_app(dsn)  # */5 * * * *
    clock = ManualClock(T0)  # 12:00:30
    scheduler = Scheduler(app, interval=3600.0, clock=clock).start()
    try:
        assert clock.wait_for_waits(1)
        assert clock.waits == [270.0]  # until 12:05:00
        clock.advance(269.0)
        assert not scheduler.wait_for_passes(2, timeout=0.3)  # 12:04:59: nothing due, no pass
        assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
        clock.advance(1.0)
        assert clock.wait_for_waits(2)
        assert clock.waits[1] == 300.0  # from 12:05:00 to 12:10:00
        assert [(name, tick.minute) for name, tick, _ in scheduler.enqueued] == [("report", 5)]
        assert db.execute("SELECT tick FROM skiplock.periodic_ticks").fetchall() == [
            (datetime(2026, 11, 30, 12, 5, tzinfo=timezone.utc),)]
    finally:
        scheduler.stop()
        app.close()
    assert scheduler.failures == 0
