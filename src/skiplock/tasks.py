"""A registered task (:class:`Task`: the handler and its defaults) and the checks of its options.

Guarantees: every option of ``App.task`` / ``App.periodic`` is checked when the handler is decorated
(:func:`task_options`), so a bad one raises a clear error at import time, never a surprise in a
worker: a queue name, a priority and ``max_attempts`` in range, a retry policy, a positive finite
``timeout``, ``lease`` one of ``"transaction"``/``"claimed"`` with ``lease_seconds`` from 1 to 86400,
and the flow-control and sequence options (docs/flow-control.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigurationError
from .flow import check_concurrency, check_partition_by, check_sequence_rule, parse_rate
from .producing import INT32, _check_int, _check_queue
from .retry import RetryPolicy, as_policy


@dataclass(frozen=True)
class Task:
    """A registered handler and its defaults. ``handler(job, **job.args)`` runs inside the job's
    transaction (transaction lease): its writes through ``job.conn`` commit with the job's completion."""

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    retry: RetryPolicy = as_policy(None)
    timeout: float | None = None
    lease: str = "transaction"
    lease_seconds: float = 60.0
    # flow control (docs/flow-control.md): at most ``concurrency`` running at once and ``rate``
    # (count, period seconds) starts, across every worker -- per partition with ``partition_by``
    concurrency: int | None = None
    rate: tuple[int, float] | None = None
    partition_by: str | None = None
    # sequences (docs/flow-control.md): jobs with the same value of argument ``sequence_by`` run one
    # at a time in enqueue order; what a job failed for good does to the rest of its sequence
    sequence_by: str | None = None
    sequence_on_failure: str = "wait"

    @property
    def limited(self) -> bool:
        """Flow-controlled: claimed only by the flow claim (worker/flow.py)."""
        return self.concurrency is not None or self.rate is not None or self.partition_by is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def task_options(*, queue: str, priority: int, max_attempts: int, retry: RetryPolicy | float | None,
                 timeout: float | None, lease: str, lease_seconds: float, concurrency: int | None, rate: str | None,
                 partition_by: str | None, sequence_by: str | None = None,
                 sequence_on_failure: str = "wait") -> dict[str, Any]:
    """``App.task``'s options, checked and normalised: the keyword arguments of :class:`Task` after its
    name and handler."""
    _check_queue(queue)
    sequence_by = check_partition_by(sequence_by, "sequence_by")
    sequence_on_failure = check_sequence_rule(sequence_on_failure)
    concurrency = check_concurrency(concurrency)
    parsed_rate = None if rate is None else parse_rate(rate)
    partition_by = check_partition_by(partition_by)
    _check_int("priority", priority, *INT32)
    _check_int("max_attempts", max_attempts, 1, INT32[1])
    policy = as_policy(retry)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if lease not in ("transaction", "claimed"):
        raise ConfigurationError(f"lease must be 'transaction' or 'claimed', got {lease!r}")
    if (isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float))
            or not math.isfinite(lease_seconds) or not 1 <= lease_seconds <= 86400):
        raise ConfigurationError(f"lease_seconds must be between 1 and 86400, got {lease_seconds!r}")
    return dict(queue=queue, priority=priority, max_attempts=max_attempts, retry=policy,
                timeout=None if timeout is None else float(timeout), lease=lease, lease_seconds=float(lease_seconds),
                concurrency=concurrency, rate=parsed_rate, partition_by=partition_by,
                sequence_by=sequence_by, sequence_on_failure=sequence_on_failure)
