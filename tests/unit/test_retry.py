"""Retry policies are pure functions: tested without a database."""

import pytest

from skiplock.app import Task
from skiplock.job import Failed, RetryLater
from skiplock.retry import Constant, Exponential, Linear, as_policy
from skiplock.worker.executor import decide_failure


def test_exponential_grows_and_caps_without_jitter():
    p = Exponential(base=1, factor=2, max_delay=10, jitter=0)
    assert [p(a) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_exponential_jitter_stays_within_bounds():
    lo = Exponential(base=10, jitter=0.2, rng=lambda: 0.0)
    hi = Exponential(base=10, jitter=0.2, rng=lambda: 1.0)
    assert lo(1) == pytest.approx(8.0)
    assert hi(1) == pytest.approx(12.0)


def test_constant_and_linear():
    assert Constant(3)(5) == 3
    assert [Linear(step=2, max_delay=5)(a) for a in (1, 2, 3)] == [2, 4, 5]


def test_as_policy_accepts_numbers_and_callables_and_rejects_nonsense():
    assert as_policy(0)(4) == 0
    assert as_policy(lambda attempt, err: 7)(1, None) == 7
    with pytest.raises(ValueError):
        as_policy(-1)
    with pytest.raises(TypeError):
        as_policy("soon")  # type: ignore[arg-type]


def test_decide_failure_retries_until_max_attempts_then_fails():
    task = Task("t", lambda job: None, retry=Constant(5))
    assert decide_failure(task, 1, 3, "boom", None) == RetryLater(5.0, "boom")
    assert decide_failure(task, 3, 3, "boom", None) == Failed("boom")


def test_decide_failure_policy_may_give_up_early_and_unknown_task_fails():
    task = Task("t", lambda job: None, retry=lambda attempt, err: None)
    assert decide_failure(task, 1, 10, "boom", None) == Failed("boom")
    assert decide_failure(None, 1, 10, "unknown", None) == Failed("unknown")
