"""The background pruner's schedule (maintenance/pruner.py): when the next pass comes, from what the
last one deleted. Pure arithmetic on a Pruner that is never started; test_pruner.py (integration)
checks the passes against a real database."""

from __future__ import annotations

import pytest

from skiplock import ConfigurationError

from skiplock.maintenance.pruner import Pruner


def pruner(interval: float = 60.0) -> Pruner:
    return Pruner(None, interval)  # type: ignore[arg-type] - _pace never touches the app


def test_a_full_pass_is_followed_by_the_next_one_soon():
    p = pruner()
    assert p._pace(1000, 1000, start=5.0) == p.catch_up == 0.2


@pytest.mark.parametrize("last_start", [None, 4.0])
def test_a_pass_that_deleted_nothing_or_has_no_predecessor_waits_the_interval(last_start):
    p = pruner()
    p._last_start = last_start
    assert p._pace(0 if last_start else 10, 1000, start=5.0) == 60.0


def test_a_short_pass_schedules_the_next_when_half_a_pass_is_due_again():
    p = pruner()
    p._last_start = 4.0
    # 250 rows came due over 1 s: 500 (half the limit) are due again in 2 s.
    assert p._pace(250, 1000, start=5.0) == pytest.approx(2.0)
    # kept between catch_up and the interval
    assert p._pace(999, 1000, start=5.0) == pytest.approx(500 / 999)
    assert p._pace(1, 1000, start=5.0) == 60.0
    p._last_start = 4.99
    assert p._pace(999, 1000, start=5.0) == p.catch_up


def test_catch_up_never_exceeds_the_interval():
    assert Pruner(None, 0.05).catch_up == 0.05  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_a_bad_pass_limit_is_refused(bad):
    with pytest.raises(ConfigurationError, match="pass_limit must be a positive number of rows"):
        Pruner(None, 60.0, pass_limit=bad)  # type: ignore[arg-type]
