"""Delays are checked where they are given: Retry, Snooze and retry policies refuse non-finite,
negative and absurd values with a clear error, and a policy that misbehaves at run time ends the
job with an error saying so instead of an unstorable retry time."""

from __future__ import annotations

import pytest

from skiplock import Retry, Snooze
from skiplock.app import MAX_DELAY, Task
from skiplock.job import Failed, RetryLater
from skiplock.retry import Constant, Exponential, Linear, as_policy
from skiplock.worker.executor import decide_failure, format_error

BAD_DELAYS = [float("inf"), float("-inf"), float("nan"), -1, 1e300, MAX_DELAY * 2, "5", True]


@pytest.mark.parametrize("value", BAD_DELAYS)
def test_retry_and_snooze_refuse_bad_delays(value):
    with pytest.raises(ValueError, match=r"Retry\(in_=\.\.\.\) must be"):
        Retry(in_=value)
    with pytest.raises(ValueError, match=r"Snooze\(seconds\) must be"):
        Snooze(value)


def test_retry_and_snooze_accept_the_range():
    assert Retry(in_=0).in_ == 0 and Retry(in_=MAX_DELAY).in_ == MAX_DELAY and Retry().in_ is None
    assert Snooze(0).seconds == 0 and Snooze(MAX_DELAY).seconds == MAX_DELAY


DELAY_PARAMETERS = [lambda v: Constant(v), lambda v: Linear(step=v), lambda v: Linear(max_delay=v),
                    lambda v: Exponential(base=v), lambda v: Exponential(max_delay=v), lambda v: as_policy(v)]


@pytest.mark.parametrize("make", DELAY_PARAMETERS)
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, 1e300, "5"])
def test_policies_refuse_bad_delays_when_built(make, value):
    with pytest.raises((ValueError, TypeError)):
        make(value)


@pytest.mark.parametrize("options", [dict(factor=float("inf")), dict(factor=float("nan")), dict(factor=0),
                                     dict(jitter=-0.1), dict(jitter=1.5), dict(jitter=float("nan"))])
def test_exponential_refuses_bad_factor_and_jitter(options):
    with pytest.raises(ValueError, match="Exponential"):
        Exponential(**options)


def test_exponential_never_overflows_on_late_attempts():
    policy = Exponential(jitter=0)
    assert policy(10_000) == policy.max_delay
    assert policy(2**31 - 1) == policy.max_delay


@pytest.mark.parametrize("returned", [float("inf"), float("nan"), -1.0, 1e300, "soon"])
def test_a_policy_returning_a_bad_delay_fails_the_job_saying_so(returned):
    task = Task("t", lambda job: None, max_attempts=5, retry=lambda attempt, error: returned)
    outcome = decide_failure(task, 1, 5, "RuntimeError: boom", RuntimeError("boom"))
    assert isinstance(outcome, Failed)
    assert outcome.error.startswith("RuntimeError: boom") and "retry policy" in outcome.error
    assert repr(returned) in outcome.error


def test_a_policy_that_raises_fails_the_job_saying_so():
    def broken(attempt, error):
        raise ZeroDivisionError("policy bug")

    task = Task("t", lambda job: None, max_attempts=5, retry=broken)
    outcome = decide_failure(task, 1, 5, "RuntimeError: boom", RuntimeError("boom"))
    assert isinstance(outcome, Failed) and "retry policy" in outcome.error and "policy bug" in outcome.error


def test_a_good_policy_still_retries():
    task = Task("t", lambda job: None, max_attempts=5, retry=Constant(2.5))
    assert decide_failure(task, 1, 5, "e", None) == RetryLater(2.5, "e")


def test_format_error_is_always_storable_text():
    try:
        raise RuntimeError("nul\x00 and \ud800 surrogate")
    except RuntimeError as exc:
        text = format_error(exc)
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogate left
    assert text.startswith("RuntimeError: nul\\x00 and \\ud800 surrogate")
