"""Retry policies: pure functions of (attempt, error) -> seconds to wait, or None to give up.

They never touch the database, so they are tested without one. ``attempt`` is the number of the
attempt that just failed (1 for the first). The worker gives up anyway once ``max_attempts`` is
reached; a policy may give up earlier by returning None.

Every delay is checked where it is given (:func:`check_delay`): a finite number of seconds from 0 to
``MAX_DELAY`` (100 years). Policies refuse bad parameters when they are built, and never return more
than their ``max_delay`` (no overflow however late the attempt). A policy that still returns a bad
delay (a custom one) ends the job ``failed`` with an error saying so (see ``decide_failure`` in
worker/executor.py): a retry that could never run is not scheduled.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol

MAX_DELAY = 100 * 365 * 86400.0  # seconds: the longest delay, retry or snooze (100 years)


def check_delay(value: Any, what: str) -> float:
    """``value`` as a delay in seconds, or ValueError saying ``what`` must be: a finite number from 0
    to MAX_DELAY. Infinity, NaN and 1e300 would make a run time PostgreSQL cannot store."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= MAX_DELAY):
        raise ValueError(f"{what} must be a number of seconds from 0 to {MAX_DELAY:,.0f} (100 years), got {value!r}")
    return float(value)


class RetryPolicy(Protocol):
    def __call__(self, attempt: int, error: BaseException | None) -> float | None: ...


@dataclass(frozen=True)
class Exponential:
    """``base * factor**(attempt-1)`` seconds, capped at ``max_delay``, with +/- ``jitter`` (a
    fraction) of random spread so jobs that failed together do not retry together."""

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.2
    rng: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        check_delay(self.base, "Exponential(base=...)")
        check_delay(self.max_delay, "Exponential(max_delay=...)")
        factor, jitter = self.factor, self.jitter
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"Exponential(factor=...) must be a finite positive number, got {factor!r}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
            raise ValueError(f"Exponential(jitter=...) must be a fraction from 0 to 1, got {jitter!r}")

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        try:
            delay = min(self.max_delay, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:  # a late attempt: factor**n is beyond any float
            delay = self.max_delay
        if self.jitter:
            delay *= 1 + self.jitter * (2 * self.rng() - 1)
        return max(0.0, delay)


@dataclass(frozen=True)
class Constant:
    """The same delay after every failure."""

    delay: float = 1.0

    def __post_init__(self) -> None:
        check_delay(self.delay, "Constant(delay=...)")

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        return self.delay


@dataclass(frozen=True)
class Linear:
    """``step * attempt`` seconds, capped at ``max_delay``."""

    step: float = 1.0
    max_delay: float = 3600.0

    def __post_init__(self) -> None:
        check_delay(self.step, "Linear(step=...)")
        check_delay(self.max_delay, "Linear(max_delay=...)")

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        return min(self.max_delay, self.step * attempt)


DEFAULT_POLICY: RetryPolicy = Exponential()


def as_policy(retry: RetryPolicy | float | int | None) -> RetryPolicy:
    """Accept a policy, a number of seconds (constant delay) or None (the default)."""
    if retry is None:
        return DEFAULT_POLICY
    if isinstance(retry, bool):
        raise TypeError("retry must be a policy, a number of seconds or None")
    if isinstance(retry, (int, float)):
        return Constant(check_delay(retry, "retry (a delay)"))
    if not callable(retry):
        raise TypeError("retry must be a policy, a number of seconds or None")
    return retry
