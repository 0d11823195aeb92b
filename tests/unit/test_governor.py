"""The lease governor (worker/governor.py): how many slots may hold a lease at once, adapted to the
lease overhead per job. Driven with an injected clock; no database, no sleeping."""

from __future__ import annotations


import pytest

from skiplock.worker.governor import Governor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def governor(slots: int = 64, **kw) -> tuple[Governor, Clock]:
    clock = Clock()
    return Governor(slots, window=1.0, min_samples=4, clock=clock, **kw), clock


def window(g: Governor, clock: Clock, overhead: float, *, waited: bool = True, samples: int = 10,
           batched: bool = False, handler: float = 0.0) -> int:
    """One window: ``samples`` leases with this overhead per job (of batched tasks if ``batched``)
    and ``handler`` seconds of handler time per job, a slot waiting for a permit if ``waited``;
    returns the limit after the window closes."""
    for _ in range(samples):
        g.observe(overhead, batched=batched, handler=handler)
    if waited:
        g._waited = True  # what try_acquire() records when a slot finds every permit taken
    clock.now += 1.0
    g.observe(overhead, batched=batched, handler=handler)  # the first sample of the next window closes this one
    return g.limit


def two_held(announced: list[int]):
    """A governor of 8 slots whose limit of 2 permits are both held; ``on_free`` appends to ``announced``."""
    g, _ = governor(slots=8, start=2, floor=1)
    g.on_free = announced.append
    first, second = g.try_acquire(), g.try_acquire()
    assert first is not None and second is not None and first is not second
    return g, first, second


def test_beyond_the_limit_no_permit_is_given_and_every_freed_permit_is_announced():
    announced: list[int] = []
    g, first, _ = two_held(announced)
    assert g.try_acquire() is None and g.held == 2  # a third slot is held back...
    assert g._waited                                 # ...and counts as waiting for a permit
    g.release(first)
    assert announced == [1]                          # the worker wakes one held-back slot
    assert g.try_acquire() is first and g.held == 2


def test_a_permit_given_back_while_the_limit_is_below_the_permits_held_is_not_announced():
    announced: list[int] = []
    g, _, b = two_held(announced)
    g.limit = 1  # what a shrinking window does
    g.release(b)
    assert announced == [] and g.try_acquire() is None


def test_a_permit_its_holder_gives_back_as_it_goes_idle_is_not_announced():
    """The slot that went idle takes it again on its next wake-up, with its session open: told of it,
    a held-back slot would open a session of its own to find the same nothing."""
    announced: list[int] = []
    g, first, _ = two_held(announced)
    g.release(first, announce=False)
    assert announced == [] and g.held == 1
    assert g.try_acquire() is first  # free all the same: the next slot to ask takes it


def test_a_tick_closes_the_window_without_a_lease_ending_or_a_permit_asked_for():
    g, clock = governor(slots=64, start=16, floor=4)
    announced: list[int] = []
    g.on_free = announced.append
    for _ in range(10):
        g.observe(0.001)
    g._waited = True
    g.tick()  # the window is not over: nothing moves
    assert g.limit == 16 and announced == []
    clock.now += 1.0
    g.tick()
    assert g.limit > 16 and announced == [g.limit - 16]


def test_a_growing_limit_is_announced_by_how_much_it_grew():
    g, clock = governor(slots=64, start=16, floor=4)
    announced: list[int] = []
    g.on_free = announced.append
    before = g.limit
    after = window(g, clock, 0.001)  # cheap leases while a slot waited: it grows
    assert after > before and announced == [after - before]


def test_the_limit_grows_while_slots_wait_and_leases_stay_cheap_up_to_every_slot():
    g, clock = governor(slots=64, start=16, floor=4)
    limits = [window(g, clock, 0.001) for _ in range(40)]
    assert limits[0] > 16
    assert limits == sorted(limits) and limits[-1] == 64


def test_the_limit_does_not_grow_when_no_slot_waits():
    g, clock = governor(slots=64, start=16)
    assert [window(g, clock, 0.001, waited=False) for _ in range(5)] == [16] * 5


def test_the_limit_shrinks_in_proportion_when_the_overhead_per_job_rises_but_never_below_the_floor():
    g, clock = governor(slots=64, start=32, floor=4, tolerance=2.0)
    window(g, clock, 0.001)                     # baseline: 1 ms per job
    grown = g.limit
    after = window(g, clock, 0.008)             # 8x the baseline: contention
    assert after < grown and after >= grown * 0.5 - 1  # at most halved per window
    for _ in range(10):
        window(g, clock, 0.050)
    assert g.limit == 4


def test_every_move_of_the_limit_is_logged_at_debug_with_its_reason(caplog):
    g, clock = governor(slots=64, start=16, floor=4, tolerance=2.0)
    with caplog.at_level("DEBUG", logger="skiplock.worker.governor"):
        window(g, clock, 0.001)                 # cheap leases, slots waiting: grows
        grown = g.limit
        window(g, clock, 0.010)                 # 10x the baseline: cut
        window(g, clock, 0.010, waited=False)   # (a second slow window cuts again)
        moves = g.changes
    lines = [r.getMessage() for r in caplog.records if r.name == "skiplock.worker.governor"]
    assert len(lines) == moves == 3
    assert lines[0].startswith(f"lease limit 16 -> {grown} of 64 slots: leases within tolerance of the baseline")
    assert lines[1].startswith(f"lease limit {grown} -> ") and "slower leases" in lines[1]
    assert "overhead per job 10.00 ms against a baseline of 1.00 ms" in lines[1]


def test_small_absolute_rises_are_not_contention():
    g, clock = governor(slots=64, start=16, slack=0.002, tolerance=2.0)
    window(g, clock, 0.0002)
    before = g.limit
    assert window(g, clock, 0.0009) >= before   # 4.5x but under 2 ms more: not a reason to shrink


def test_an_overhead_rise_small_beside_the_handlers_time_is_not_contention():
    """The same rise of the overhead per job (2 ms to 5 ms: 2.5 x, 3 ms more) shrinks the limit for
    near-instant jobs, where it is most of the lease, and not for 10 ms jobs, whose leases take 21 %
    longer (under the tolerance of 30 %); 30 ms more for those does shrink it, in proportion to the
    whole lease, not to the overhead alone."""
    instant, clock = governor(slots=64, start=16, slack=0.002, tolerance=1.3)
    window(instant, clock, 0.002)
    before = instant.limit
    assert window(instant, clock, 0.005) < before
    ten, clock = governor(slots=64, start=16, slack=0.002, tolerance=1.3)
    window(ten, clock, 0.002, handler=0.010)
    before = ten.limit
    assert window(ten, clock, 0.005, handler=0.010) >= before
    after = window(ten, clock, 0.032, handler=0.010)
    assert after < before and after >= int(before * 1.3 * 0.012 / 0.042)


def test_long_jobs_whose_leases_give_few_samples_get_every_slot():
    g, clock = governor(slots=64, start=8)
    limits = [window(g, clock, 0.0, samples=0) for _ in range(4)]
    assert limits == [16, 32, 64, 64]


def test_without_adaptation_every_slot_holds_a_lease():
    g, clock = governor(slots=64, adaptive=False)
    assert g.limit == 64
    window(g, clock, 0.001)
    window(g, clock, 1.0)
    assert g.limit == 64


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_a_small_worker_starts_with_every_slot(slots):
    g, _ = governor(slots=slots)
    assert g.limit == slots


def test_a_permit_keeps_its_state_and_the_last_one_given_back_is_handed_out_first():
    g, _ = governor(slots=4, start=2, floor=1)
    first, second = g.try_acquire(), g.try_acquire()
    assert first is not None and second is not None and first is not second
    first.state, second.state = "warm 1", "warm 2"
    g.release(first)
    g.release(second)
    again = g.try_acquire()
    assert again is second and again.state == "warm 2"  # a slot taking it over inherits its claim size


def test_a_holder_is_told_to_give_its_permit_back_when_the_limit_falls_below_the_permits_held():
    g, _ = governor(slots=8, start=2, floor=1)
    a, b = g.try_acquire(), g.try_acquire()
    assert a is not None and b is not None and not g.over()
    g.limit = 1  # what a shrinking window does
    assert g.over()
    g.release(b)
    assert not g.over()


def test_leases_of_batched_tasks_never_grow_past_the_start_in_one_process():
    g, clock = governor(slots=64, start=16, floor=4)
    g.share(1)
    assert [window(g, clock, 0.0001, batched=True) for _ in range(10)] == [16] * 10
    assert [window(g, clock, 0.0, samples=1, batched=True) for _ in range(3)] == [16] * 3  # few samples too


def test_processes_sharing_a_database_each_keep_their_share_while_batching():
    g, clock = governor(slots=8, start=16, floor=4)
    assert g.limit == 8
    g.share(8)  # 8 live worker processes: 16 / 8 leases each
    assert g.cap == 2
    assert window(g, clock, 0.0001, batched=True) == 2  # cut to the share at the first batched window
    assert [window(g, clock, 0.0001, batched=True) for _ in range(5)] == [2] * 5
    g.share(3)  # some stopped: a bigger share, grown into while slots wait
    limits = [window(g, clock, 0.0001, batched=True) for _ in range(10)]
    assert limits == sorted(limits) and limits[-1] == 6


def test_slower_jobs_claimed_one_at_a_time_adapt_past_the_share():
    g, clock = governor(slots=64, start=16, floor=4)
    g.share(8)
    limits = [window(g, clock, 0.0001, batched=False) for _ in range(40)]
    assert limits[-1] == 64
    assert window(g, clock, 0.0001, batched=True) == 2  # fast jobs again: back to the share


def test_the_share_stays_at_least_one_permit():
    g, _ = governor(slots=4, start=16)
    g.share(1000)
    assert g.cap == 1


def test_before_any_lease_ends_a_worker_stays_within_its_share_then_long_jobs_grow_it():
    g, clock = governor(slots=64, start=16)
    for _ in range(3):  # slots wait, no lease has ended yet: no evidence either way
        g._waited = True
        clock.now += 1.0
        g._tick()
    assert g.limit == 16
    assert [window(g, clock, 0.0, samples=1, batched=False) for _ in range(3)] == [32, 64, 64]  # long jobs


def test_more_processes_cut_slower_jobs_back_to_the_share_and_they_grow_again_from_there():
    g, clock = governor(slots=64, start=16)
    g.share(1)
    for _ in range(30):
        window(g, clock, 0.0001, batched=False)
    assert g.limit == 64  # slower jobs, cheap leases: every slot
    g.share(8)  # 7 more processes came
    assert g.limit == 2
    g.share(8)  # the same count again: no new cut
    grown = [window(g, clock, 0.0001, batched=False) for _ in range(3)]
    assert grown == sorted(grown) and grown[-1] > 2
    g.share(8)
    assert g.limit == grown[-1]
