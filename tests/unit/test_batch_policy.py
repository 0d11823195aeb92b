"""Which tasks run alone: the batch policy's view of a task's handler times (worker/batching.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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
