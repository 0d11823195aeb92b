"""The relay's delivery decisions are a pure function: no database, no network."""

from __future__ import annotations

from datetime import datetime, timezone

from skiplock.backend.outbox_base import Message
from skiplock.outbox import PermanentDeliveryError, RetryableDeliveryError
from skiplock.outbox.policy import DEFAULT_RETRY, decide
from skiplock.retry import Constant, Exponential


def msg(attempt: int = 1, max_attempts: int = 5) -> Message:
    return Message(id=1, topic="t", key=None, payload={}, idempotency_key="k", attempt=attempt,
                   max_attempts=max_attempts, created_at=datetime.now(timezone.utc))


def test_success_is_sent():
    assert decide(msg(), None).state == "sent"


def test_permanent_error_fails_at_once():
    out = decide(msg(attempt=1), PermanentDeliveryError("HTTP 404"))
    assert out.state == "failed" and "permanent failure on attempt 1" in out.error and "HTTP 404" in out.error


def test_retryable_error_backs_off_until_the_last_attempt():
    out = decide(msg(attempt=2), RetryableDeliveryError("HTTP 503"), Constant(7))
    assert (out.state, out.delay) == ("pending", 7) and "attempt 2/5" in out.error
    last = decide(msg(attempt=5), RetryableDeliveryError("HTTP 503"), Constant(7))
    assert last.state == "failed" and "gave up after attempt 5/5" in last.error


def test_retry_after_is_the_least_delay_and_any_exception_is_retryable_with_traceback():
    assert decide(msg(), RetryableDeliveryError("429", retry_after=120), Constant(1)).delay == 120
    assert decide(msg(), RetryableDeliveryError("429", retry_after=1), Constant(30)).delay == 30
    out = decide(msg(), ValueError("bug in sink"), Constant(1))
    assert out.state == "pending" and "ValueError: bug in sink" in out.error


def test_a_policy_returning_none_gives_up():
    out = decide(msg(), RetryableDeliveryError("x"), lambda attempt, error: None)
    assert out.state == "failed" and "retry policy gave up" in out.error


def test_default_backoff_grows_with_jitter_and_is_capped():
    fixed = Exponential(base=1.0, factor=2.0, max_delay=600.0, jitter=0.25, rng=lambda: 0.5)
    assert [fixed(a, None) for a in (1, 2, 3, 11, 30)] == [1.0, 2.0, 4.0, 600.0, 600.0]
    spread = {round(DEFAULT_RETRY(3, None), 6) for _ in range(50)}
    assert len(spread) > 1 and all(3.0 <= d <= 5.0 for d in spread)


def test_a_policy_returning_a_bad_delay_fails_the_message_saying_so():
    for bad in (float("nan"), float("inf"), -1.0, 1e300):
        out = decide(msg(attempt=1), RetryableDeliveryError("HTTP 503"), lambda attempt, error, bad=bad: bad)
        assert out.state == "failed", (bad, out)
        assert "retry policy" in out.error and "HTTP 503" in out.error, out.error

    def broken(attempt, error):
        raise RuntimeError("policy bug")

    out = decide(msg(attempt=1), RetryableDeliveryError("HTTP 503"), broken)
    assert out.state == "failed" and "policy bug" in out.error


def test_what_a_sink_says_is_stored_as_text_postgresql_can_hold():
    out = decide(msg(attempt=1), RetryableDeliveryError("bad\x00byte \udcff here"), Constant(1))
    assert "\x00" not in out.error and "\\x00" in out.error
    out.error.encode("utf-8")  # no lone surrogate left
