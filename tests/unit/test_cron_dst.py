"""Cron schedules across daylight-saving changes (Europe/Paris, 2026), the way Vixie cron treats them.

Spring forward: 2026-03-29, 02:00 CET -> 03:00 CEST (01:00 UTC); local 02:00-02:59 does not exist.
Fall back: 2026-10-25, 03:00 CEST -> 02:00 CET (01:00 UTC); local 02:00-02:59 happens twice.

A *fixed-time* schedule (neither its minute nor its hour field starts with ``*``) fires once per
local wall-clock time: at the first of two occurrences, and -- when its time is skipped -- at the
change itself (03:00 CEST). A *wildcard* schedule (``0 * * * *``, ``*/30 * * * *``) follows elapsed
time: it fires at each real occurrence (both 02:00s in autumn) and not at all in the skipped hour.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from skiplock.maintenance.periodic import Schedule

UTC = timezone.utc
SPRING = datetime(2026, 3, 28, 12, tzinfo=UTC)  # the day before spring forward
AUTUMN = datetime(2026, 10, 24, 12, tzinfo=UTC)  # the day before fall back


def ticks(cron: str, start: datetime, hours: int = 48, tz: str = "Europe/Paris") -> list[datetime]:
    """The ticks in [start, start + hours), stepping with next_after."""
    s = Schedule.create("t", cron, "{}", tz, "skip")
    out, t = [], start - timedelta(microseconds=1)
    while True:
        t = s.next_after(t)
        if t >= start + timedelta(hours=hours):
            return out
        out.append(t)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_fixed_time_in_the_repeated_hour_fires_once_at_its_first_occurrence():
    # 02:30 CEST (00:30 UTC) -- not again at 02:30 CET (01:30 UTC) -- then 02:30 CET the next day
    assert ticks("30 2 * * *", AUTUMN) == [at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30)]


def test_a_fixed_time_in_the_skipped_hour_fires_at_the_change():
    # 02:30 does not exist on 2026-03-29: the job runs at the change, 03:00 CEST = 01:00 UTC
    assert ticks("30 2 * * *", SPRING) == [at(2026, 3, 29, 1, 0), at(2026, 3, 30, 0, 30)]


def test_several_fixed_times_in_the_skipped_hour_fire_once_at_the_change():
    assert ticks("0,30 2 * * *", SPRING, hours=30) == [at(2026, 3, 29, 1, 0)]


def test_fixed_times_around_the_changes_are_unaffected():
    assert ticks("15 1 * * *", AUTUMN) == [at(2026, 10, 24, 23, 15), at(2026, 10, 26, 0, 15)]
    assert ticks("0 3 * * *", AUTUMN) == [at(2026, 10, 25, 2, 0), at(2026, 10, 26, 2, 0)]
    assert ticks("0 3 * * *", SPRING) == [at(2026, 3, 29, 1, 0), at(2026, 3, 30, 1, 0)]


def test_an_hourly_schedule_fires_every_real_hour_through_both_changes():
    autumn = ticks("0 * * * *", datetime(2026, 10, 24, 22, tzinfo=UTC), hours=5)
    assert autumn == [at(2026, 10, 24, 22), at(2026, 10, 24, 23), at(2026, 10, 25, 0), at(2026, 10, 25, 1),
                      at(2026, 10, 25, 2)]  # local 00:00, 01:00, 02:00 CEST, 02:00 CET, 03:00 CET
    spring = ticks("0 * * * *", datetime(2026, 3, 28, 23, tzinfo=UTC), hours=3)
    assert spring == [at(2026, 3, 28, 23), at(2026, 3, 29, 0), at(2026, 3, 29, 1)]  # 00:00, 01:00, 03:00 local


def test_a_wildcard_schedule_skips_the_skipped_hour():
    spring = ticks("*/30 * * * *", datetime(2026, 3, 29, 0, tzinfo=UTC), hours=2)
    local = [t.astimezone(Schedule.create("t", "* * * * *", "{}", "Europe/Paris", "skip").tz).strftime("%H:%M")
             for t in spring]
    assert local == ["01:00", "01:30", "03:00", "03:30"]


@pytest.mark.parametrize("cron", ["30 2 * * *", "0 * * * *", "*/30 * * * *", "0,30 2 * * *"])
@pytest.mark.parametrize("start", [SPRING, AUTUMN])
def test_latest_at_or_before_agrees_with_next_after(cron, start):
    """The scheduler uses both: the latest tick at or before a moment is the one next_after steps to."""
    s = Schedule.create("t", cron, "{}", "Europe/Paris", "skip")
    expected = ticks(cron, start)
    for tick in expected:
        assert s.latest_at_or_before(tick) == tick
        assert s.latest_at_or_before(tick + timedelta(seconds=59)) == tick
        assert s.next_after(tick - timedelta(seconds=1)) == tick
    for earlier, later in zip(expected, expected[1:]):
        assert s.latest_at_or_before(later - timedelta(seconds=1)) == earlier
