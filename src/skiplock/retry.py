"""Retry policies: pure functions of (attempt, error) -> seconds to wait, or None to give up.

They never touch the database, so they are tested without one. ``attempt`` is the number of the
attempt that just failed (1 for the first). The worker gives up anyway once ``max_attempts`` is
reached; a policy may give up earlier by returning None.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Protocol


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

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        delay = min(self.max_delay, self.base * self.factor ** max(0, attempt - 1))
        if self.jitter:
            delay *= 1 + self.jitter * (2 * self.rng() - 1)
        return max(0.0, delay)


@dataclass(frozen=True)
class Constant:
    """The same delay after every failure."""

    delay: float = 1.0

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        return self.delay


@dataclass(frozen=True)
class Linear:
    """``step * attempt`` seconds, capped at ``max_delay``."""

    step: float = 1.0
    max_delay: float = 3600.0

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
        if retry < 0:
            raise ValueError("retry delay must be >= 0")
        return Constant(float(retry))
    if not callable(retry):
        raise TypeError("retry must be a policy, a number of seconds or None")
    return retry
