"""The claimed lease's run: a short transaction marks the job ``running`` with our owner token and
a lease and commits; the handler runs with no transaction held while the heartbeat renews the lease;
the completer's fenced finishing write ends it (``Completer.finish_claimed``)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from ..backend.base import ClaimedJob
from ..job import Cancelled, Failed, LeaseLost, Outcome
from .handler import make_job

if TYPE_CHECKING:
    from ..app import Task
    from ..backend.base import Lease
    from .executor import Executor


def run_claimed(executor: "Executor", lease: "Lease", claimed: ClaimedJob, task: "Task", slot: str) -> Outcome:
    """Claimed lease: mark the job running with our owner token and a lease, COMMIT (the attempt
    is now durable and the row lock released), run the handler while the heartbeat renews the
    lease, then finish with a write fenced on state and owner. The handler's writes through
    ``job.conn`` commit with that fenced write, so they vanish too if the lease was lost. A job
    claimed with no attempt left (nothing re-queues one, but a row may say so) is failed, not run."""
    completer = executor.completer
    started_at = claimed.claimed_at
    if claimed.attempts >= claimed.max_attempts:
        error = (f"gave up: {claimed.attempts} attempt(s) used of max_attempts {claimed.max_attempts}; "
                 "the job is not run again")
        outcome = completer.write(lease, claimed, claimed.attempts, Failed(error), started_at, slot, False)
        if lease.alive():
            lease.commit()
        return outcome
    owner = uuid.uuid4()
    started = executor.backend.start_claimed(lease, claimed, owner, task.lease_seconds, slot)
    lease.commit()
    if started is None:  # not queued any more (cannot happen while we held its lock)
        return LeaseLost(Failed("not queued when claimed"))
    attempt, cancel_reason = started
    if cancel_reason is not None:
        return completer.finish_claimed(lease, claimed, attempt - 1, Cancelled(cancel_reason), started_at, slot,
                                        owner, task)
    if executor.heartbeat is not None:
        executor.heartbeat.hold(claimed.id, owner, task.lease_seconds)
    try:
        outcome = executor.handlers.handle(task, make_job(claimed, attempt, slot, lease), claimed, attempt, lease)
    finally:
        if executor.heartbeat is not None:
            executor.heartbeat.release(claimed.id)
    return completer.finish_claimed(lease, claimed, attempt, outcome, started_at, slot, owner, task)
