"""Which tasks run alone: the batch policy's view of a task's handler times (worker/batching.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from skiplock.worker.batching import RUNS_KEPT, BatchPolicy


def task(name: str = "t") -> Any:
    return SimpleNamespace(name=name, lease="transaction", timeout=None)


def test_a_task_not_yet_measured_runs_alone_and_a_fast_one_is_batched():
    policy = BatchPolicy(batch_budget=0.05)
    assert policy.alone(task())
    policy.measured("t", 0.001)
    assert not policy.alone(task())


def test_a_few_stretched_runs_do_not_make_a_fast_task_slow():
    policy = BatchPolicy(batch_budget=0.05)  # fast: at most 5 ms
    for i in range(RUNS_KEPT):
        policy.measured("t", 0.040 if i % 3 == 0 else 0.001)  # a third of the runs waited for a core
    assert not policy.alone(task())


def test_a_task_whose_runs_are_mostly_slow_runs_alone():
    policy = BatchPolicy(batch_budget=0.05)
    for _ in range(RUNS_KEPT):
        policy.measured("t", 0.001)
    for _ in range(RUNS_KEPT * 3 // 4 + 1):  # it became slow: most of its recent runs take 40 ms
        policy.measured("t", 0.040)
    assert policy.alone(task())


def test_claimed_lease_and_timed_tasks_always_run_alone():
    policy = BatchPolicy()
    policy.measured("t", 0.0001)
    assert policy.alone(SimpleNamespace(name="t", lease="claimed", timeout=None))
    assert policy.alone(SimpleNamespace(name="t", lease="transaction", timeout=5.0))


def test_a_claim_size_grows_by_doubling_and_falls_to_a_power_of_two_that_fitted():
    """Claim sizes stay powers of two (each is a claim text whose plan PostgreSQL keeps:
    ``with_limit`` in backend/postgres/queries.py)."""
    from skiplock.worker.batching import BatchRun, ClaimSize

    size = ClaimSize(32, 0.0005)
    seen = []
    for _ in range(7):
        size.after(size.value, BatchRun(outcomes=[None] * size.value))
        seen.append(size.value)
    assert seen == [2, 4, 8, 16, 32, 32, 32]
    size.after(32, BatchRun(outcomes=[None] * 23, out_of_time=True))  # 23 fitted in the budget
    assert size.value == 16
    size.after(16, BatchRun(outcomes=[], out_of_time=True))  # none did (the worker is stopping)
    assert size.value == 1


def test_while_other_slots_are_idle_a_claim_takes_only_what_starts_within_batch_wait():
    """``BatchPolicy.share``: no ready job waits behind more than ``batch_wait`` of batch-mates while
    another slot could have run it; with every slot busy, the whole claim size (a backlog)."""
    from skiplock.worker.batching import ClaimSize

    policy = BatchPolicy(batch_size=32, batch_wait=0.016)
    size = ClaimSize(32, 0.0005, start=32)
    assert policy.share(size, idle_slots=5) == 32  # not measured yet: the claim size
    size.per_job = 0.001  # 1 ms jobs: 17 start within 16 ms -> 16 (a power of two)
    assert policy.share(size, idle_slots=5) == 16
    assert policy.share(size, idle_slots=0) == 32  # every other slot busy
    size.per_job = 0.003
    assert policy.share(size, idle_slots=1) == 4  # 6 fit -> 4
    size.per_job = 0.040
    assert policy.share(size, idle_slots=1) == 1
    size.per_job = 0.00003  # near-instant jobs: all 32 start within the wait
    assert policy.share(size, idle_slots=15) == 32
    assert BatchPolicy(batch_size=32, batch_wait=None).share(ClaimSize(32, 0.0005, start=32), 15) == 32


@pytest.mark.parametrize("wait", [0, -1, 61, True, "0.01"])
def test_batch_wait_must_be_a_positive_number_of_seconds_or_none(wait):
    with pytest.raises(ValueError, match="batch_wait"):
        BatchPolicy(batch_wait=wait)
