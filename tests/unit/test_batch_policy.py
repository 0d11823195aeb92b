"""Which tasks run alone: the batch policy's view of a task's handler times (worker/batching.py)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from skiplock.worker.batching import FLOW_TURNS, RUNS_KEPT, BatchPolicy, Turns

from support import wait_for


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


def free_turns(policy: BatchPolicy, flow: bool, slots: range) -> int:
    """How many of ``slots`` get a turn of the kind at once (a slot that finds them all held gives
    up after 0.2 s: its ``stopping`` is set then). They are given back after."""
    taken = []
    for i in slots:
        stopping = threading.Event()
        timer = threading.Timer(0.2, stopping.set)
        timer.start()
        if policy.take_turn(i, stopping, flow):
            taken.append(i)
        timer.cancel()
    for i in taken:
        policy.give_turn(i)
    return len(taken)


def test_flow_batches_have_turns_of_their_own_shared_by_the_live_processes():
    """Plain batches take ``batch_slots`` turns; flow-controlled batches take turns of their own,
    FLOW_TURNS shared by the live worker processes (rounded up, at least one each) unless
    ``flow_batch_slots`` fixes them."""
    policy = BatchPolicy(batch_slots=1)
    assert free_turns(policy, False, range(0, 5)) == 1
    assert free_turns(policy, True, range(10, 15)) == FLOW_TURNS == 3
    policy.take_turn(0, threading.Event())  # a plain turn held takes no flow turn
    assert free_turns(policy, True, range(10, 15)) == 3
    policy.give_turn(0)
    for processes, each in [(2, 2), (3, 1), (8, 1), (1, 3)]:
        policy.live_processes(processes)
        assert free_turns(policy, True, range(10, 15)) == each, processes
    fixed = BatchPolicy(flow_batch_slots=2)
    fixed.live_processes(8)
    assert free_turns(fixed, True, range(10, 15)) == 2


def test_a_lower_limit_lets_no_new_holder_in_until_enough_turns_are_given_back():
    turns = Turns(3)
    assert all(turns.acquire(0) for _ in range(3))
    turns.resize(1)
    turns.release()
    assert not turns.acquire(0.01)  # two held, limit one
    turns.release()
    assert not turns.acquire(0.01)  # one held
    got = []
    waiter = threading.Thread(target=lambda: got.append(turns.acquire(5)))
    waiter.start()
    turns.release()  # none held: the waiter gets it
    waiter.join(5)
    assert got == [True] and turns.held == 1
    turns.release()
    with pytest.raises(ValueError):
        turns.release()


def test_a_turn_given_back_goes_to_the_waiter_that_gave_one_back_last():
    """Last in, first out: the slot whose turn ended most recently gets the next one (its thread and
    its session are the warm ones), not the slot that waited longest; none is lost to a wait that
    times out."""
    turns = Turns(1)
    for key in ("a", "b"):  # "b" gave its turn back after "a"
        assert turns.acquire(0, key=key)
        turns.release(key)
    assert turns.acquire(0, key="m")
    got: list[str] = []

    def wait(key):
        if turns.acquire(5, key=key):
            got.append(key)

    first = threading.Thread(target=wait, args=("a",))
    first.start()
    wait_for(lambda: len(turns._waiters) == 1)
    second = threading.Thread(target=wait, args=("b",))
    second.start()
    wait_for(lambda: len(turns._waiters) == 2)
    turns.release("m")  # "a" waited longer; "b" gave one back more recently
    second.join(5)
    assert got == ["b"] and turns.held == 1
    turns.release("b")
    first.join(5)
    assert got == ["b", "a"] and turns.held == 1
    assert not turns.acquire(0.01, key="x")  # held by "a": the wait times out, and leaves no waiter
    assert not turns._waiters
    turns.release("a")
    assert turns.held == 0


def test_a_raised_limit_hands_turns_to_the_waiting_slots_at_once():
    turns = Turns(1)
    assert turns.acquire(0, key="holder")
    got: list[str] = []
    threads = [threading.Thread(target=lambda k=k: got.append(k) if turns.acquire(5, key=k) else None)
               for k in ("a", "b")]
    for t in threads:
        t.start()
    wait_for(lambda: len(turns._waiters) == 2)
    turns.resize(3)  # (live_processes: fewer processes, more turns each)
    for t in threads:
        t.join(5)
    assert sorted(got) == ["a", "b"] and turns.held == 3 and not turns._waiters
    turns.resize(1)
    for key in ("holder", "a"):
        turns.release(key)  # above the limit: nobody waits, the count just falls
    assert turns.held == 1 and not turns.acquire(0.01, key="c")


def test_a_stuck_turn_of_one_kind_does_not_stop_claims_of_the_other():
    policy = BatchPolicy(batch_slots=1, flow_batch_slots=1, batch_budget=0.01)  # stuck after 1 s
    stopping = threading.Event()
    assert policy.take_turn(0, stopping, flow=True)
    assert policy.take_turn(1, stopping)  # the plain kind is free
    policy._turns_taken[0] = (time.monotonic() - 2, policy._turns_taken[0][1])  # the flow turn is stuck
    assert not policy.take_turn(2, stopping, flow=True)  # gives up at once: claims one job instead
    policy.give_turn(0)
    policy.give_turn(1)


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_flow_batch_slots_must_be_a_positive_integer_or_none(value):
    with pytest.raises(ValueError, match="flow_batch_slots"):
        BatchPolicy(flow_batch_slots=value)


def test_a_claim_runs_side_by_side_only_after_a_batch_that_was_not_near_instant():
    from skiplock.worker.batching import BatchRun, WholeBatches
    from skiplock.worker.side_by_side import plan

    policy = BatchPolicy(batch_size=8)
    size = policy.claim_size()
    size.value = 8
    assert not plan(policy, size)  # not measured yet: as before
    size.after(8, BatchRun([], seconds_per_job=0.0001))  # near-instant: a hand-off costs more than the job
    assert not plan(policy, size)
    size.after(8, BatchRun([], seconds_per_job=0.002))
    assert plan(policy, size)
    assert not plan(BatchPolicy(batch_size=8, side_by_side=False), size)
    size.value = 1
    assert not plan(policy, size)  # one job: nothing to hand out
    whole = WholeBatches(8, side_by_side=True)
    assert plan(whole, whole.claim_size())  # measured or not
    assert not plan(WholeBatches(8), whole.claim_size())  # off by default there
