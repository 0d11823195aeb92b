"""Cron across daylight-saving changes through the real scheduler and database: the scheduler steps
through the nights of 2026-03-29 and 2026-10-25 in Europe/Paris on an injected clock, and the jobs
and (schedule, tick) rows it writes are counted (tick rules: tests/unit/test_cron_dst.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import skiplock
from skiplock.maintenance.periodic import Scheduler

UTC = timezone.utc


def night(dsn: str, db, start: datetime, hours: int = 6) -> dict[str, list[datetime]]:
    """Run a scheduler every minute of the clock from ``start`` for ``hours``; the ticks enqueued per
    schedule, read back from the database (each with its job)."""
    app = skiplock.App(dsn)

    @app.periodic("30 2 * * *", name="nightly", timezone="Europe/Paris")
    def nightly(job):
        pass

    @app.periodic("0 * * * *", name="hourly", timezone="Europe/Paris")
    def hourly(job):
        pass

    try:
        scheduler = Scheduler(app)
        scheduler.catch_up(start)
        now = start
        while now < start + timedelta(hours=hours):
            now += timedelta(minutes=1)
            scheduler.run_due(now)
    finally:
        app.close()
    rows = db.execute("SELECT t.schedule, t.tick FROM skiplock.periodic_ticks t "
                      "JOIN skiplock.jobs j ON j.id = t.job_id AND j.task = t.schedule ORDER BY t.tick").fetchall()
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == len(rows)
    out: dict[str, list[datetime]] = {"nightly": [], "hourly": []}
    for schedule, tick in rows:
        out[schedule].append(tick)
    return out


def test_autumn_a_fixed_time_job_is_enqueued_once_and_an_hourly_one_every_hour(dsn, db):
    got = night(dsn, db, datetime(2026, 10, 24, 21, 30, tzinfo=UTC))  # 23:30 CEST .. 02:30 CET + 1h
    assert got["nightly"] == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]  # 02:30 CEST only
    assert got["hourly"] == [datetime(2026, 10, 24, h, tzinfo=UTC) for h in (22, 23)] + \
        [datetime(2026, 10, 25, h, tzinfo=UTC) for h in (0, 1, 2, 3)]  # 00:00, 01:00, 02:00 x2, 03:00, 04:00


def test_spring_a_fixed_time_in_the_skipped_hour_is_enqueued_at_the_change(dsn, db):
    got = night(dsn, db, datetime(2026, 3, 28, 21, 30, tzinfo=UTC))  # 22:30 CET .. 04:30 CEST
    assert got["nightly"] == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]  # 03:00 CEST, for 02:30
    assert got["hourly"] == [datetime(2026, 3, 28, h, tzinfo=UTC) for h in (22, 23)] + \
        [datetime(2026, 3, 29, h, tzinfo=UTC) for h in (0, 1, 2, 3)]  # 23:00, 00:00, 01:00, 03:00, 04:00, 05:00
