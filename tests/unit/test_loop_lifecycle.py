"""The one lifecycle of every loop (skiplock.lifecycle): events, backoff on an injected clock and random
source, stop during a backoff, a failing pass logged and backed off (never fatal), the outage report
through the owner's Reconnects, and the shared signal handling. No sleeping: the ManualClock moves
only when the test advances it, and the tests wait on the loop's events."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from skiplock.errors import DatabaseUnavailable
from skiplock.lifecycle import Escalation, ManualClock, Loop, Signals
from skiplock.maintenance.service import Service
from skiplock.reconnect import Reconnects



class Scripted(Loop):
    """A loop whose passes raise the scripted exceptions, in order, then succeed."""

    name = "scripted"

    def __init__(self, script: list[BaseException | None], interval: float = 5.0, **kw):
        super().__init__(interval, **kw)
        self.script = list(script)
        self.calls = 0
        self.stopped_with: list[str] = []

    def step(self) -> None:
        self.calls += 1
        if self.script:
            exc = self.script.pop(0)
            if exc is not None:
                raise exc

    def on_stop(self) -> None:
        self.stopped_with.append("on_stop")


def advance_through(clock: ManualClock, n: int) -> list[float]:
    """Let the loop begin its waits one by one, moving the clock past each; the waits asked for."""
    for i in range(1, n + 1):
        assert clock.wait_for_waits(i), f"the loop never began wait {i}: {clock.waits}"
        clock.advance(clock.waits[i - 1])
    return clock.waits[:n]


def test_events_started_a_pass_each_interval_and_stopped():
    clock = ManualClock()
    loop = Scripted([], interval=5.0, clock=clock).start()
    try:
        assert loop.started.wait(10)
        assert clock.wait_for_waits(1)
        assert (loop.passes, clock.waits) == (1, [5.0])  # one pass, then the interval on the clock
        clock.advance(4.9)
        assert not loop.wait_for_passes(2, timeout=0.2)  # not due yet: the clock decides, not time
        clock.advance(0.1)
        assert loop.wait_for_passes(2)
    finally:
        loop.stop()
    assert loop.stopped.is_set() and loop.stopped_with == ["on_stop"]
    assert loop.failures == 0 and loop.last_error is None


def test_a_failing_pass_is_logged_and_backed_off_with_jitter_never_fatal(caplog):
    clock = ManualClock()
    boom = ValueError("boom")
    loop = Scripted([boom, boom, boom, None, boom], clock=clock, rng=lambda low, high: high)
    with caplog.at_level(logging.WARNING, logger="skiplock.lifecycle"):
        loop.start()
        try:
            waits = advance_through(clock, 5)
            assert loop.wait_for_passes(5)
        finally:
            loop.stop()
    # 0.25 doubling (the ceiling of the full-jitter draw), the interval after a success, and a
    # failure after that success starts again from the base.
    assert waits == [0.25, 0.5, 1.0, 5.0, 0.25]
    assert loop.failures == 4 and loop.last_error is boom and loop.calls >= 5
    failed = [r for r in caplog.records if "pass failed (boom); retrying in" in r.getMessage()]
    assert len(failed) == 4 and all(r.exc_info for r in failed)  # an unexpected error keeps its traceback


def test_the_backoff_draws_from_the_injected_random_source_and_is_capped():
    clock = ManualClock()
    draws: list[tuple[float, float]] = []

    def rng(low: float, high: float) -> float:
        draws.append((low, high))
        return high / 2

    loop = Scripted([RuntimeError("x")] * 5, clock=clock, rng=rng, max_backoff=1.0).start()
    try:
        waits = advance_through(clock, 5)
    finally:
        loop.stop()
    assert draws == [(0.0, 0.25), (0.0, 0.5), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)]
    assert waits == [0.125, 0.25, 0.5, 0.5, 0.5]


def test_stop_during_a_backoff_returns_at_once():
    """Real clock, an hour-long backoff: stop() ends it (the join's timeout is a safety net only)."""
    loop = Scripted([RuntimeError("down")] * 100, rng=lambda low, high: 3600.0).start()
    assert loop.wait_for_failures(1)
    loop.stop(timeout=30)
    assert loop.stopped.is_set() and loop.failures == 1


def test_stop_ends_the_pause_between_passes_and_poke_runs_the_next_pass_now():
    loop = Scripted([], interval=3600.0).start()
    assert loop.wait_for_passes(1)
    loop.poke()
    assert loop.wait_for_passes(2)
    loop.stop(timeout=30)
    assert loop.stopped.is_set()


def test_a_lost_database_is_reported_once_through_the_owners_reconnects(caplog):
    recovery = Reconnects(None, logging.getLogger("skiplock.test-owner"), cap=0.0)
    lost = DatabaseUnavailable("server gone")
    loop = Scripted([lost, lost, lost], interval=3600.0, rng=lambda low, high: 0.0)
    loop.recovery = recovery
    with caplog.at_level(logging.DEBUG, logger="skiplock"):
        loop.start()
        try:
            assert loop.wait_for_passes(4)
        finally:
            loop.stop()
    owner = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "skiplock.test-owner"]
    warnings = [m for level, m in owner if level == logging.WARNING]
    assert warnings == ["scripted: database connection lost (server gone); reconnecting"]
    assert [m for level, m in owner if level == logging.INFO and "reconnected to the database after" in m]
    assert not [r for r in caplog.records if "pass failed" in r.getMessage()]
    assert not recovery.down


def test_an_exception_outside_retry_on_ends_the_loop_and_is_raised():
    class Narrow(Scripted):
        retry_on = (DatabaseUnavailable,)

    loop = Narrow([DatabaseUnavailable("x"), KeyError("bug")], rng=lambda low, high: 0.0)
    with pytest.raises(KeyError):
        loop.run()
    assert loop.failures == 1 and isinstance(loop.last_error, KeyError)
    assert loop.stopped.is_set() and loop.stopped_with == ["on_stop"]


def test_a_shared_stopping_event_stops_the_loop_and_start_never_clears_it():
    owner = threading.Event()
    owner.set()
    loop = Scripted([], stopping=owner).start()
    assert loop.stopped.wait(10) and loop.passes == 0  # the owner had stopped: no pass at all
    assert owner.is_set()


def test_service_keeps_its_subclass_api():
    class Counting(Service):
        name = "counting"

        def __init__(self):
            super().__init__(3600.0)
            self.n = 0

        def step(self) -> None:
            self.n += 1

        def next_delay(self) -> float:
            return 0.0 if self.n < 3 else self.interval

    s = Counting()
    assert s.start() is s
    assert s.wait_for_passes(3, timeout=10)
    s.stop(10)
    assert s.n == 3 and s.passes == 3


def test_escalate_first_signal_is_graceful_every_later_one_aborts():
    calls: list[tuple[str, str]] = []
    signals = Escalation(lambda name: calls.append(("graceful", name)), lambda name: calls.append(("abort", name)))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        signals(sig)
    assert calls == [("graceful", "SIGTERM"), ("abort", "SIGINT"), ("abort", "SIGTERM")]
    assert signals.received == 3


def test_a_second_signal_handled_inside_the_first_ones_action_aborts():
    """A Python signal handler can run inside another one's action (between any two bytecodes): the
    second signal, handled while the first one's graceful stop runs, must abort -- not be taken for a
    first one. A real signal, sent from inside the action."""
    calls: list[tuple[str, str]] = []

    def graceful(name: str) -> None:
        calls.append(("graceful", name))
        os.kill(os.getpid(), signal.SIGTERM)  # the second one, while this action still runs
        for _ in range(1000):  # bytecodes: Python runs the pending handler between two of them
            if len(calls) > 1:
                break
            time.sleep(0.001)

    signals = Escalation(graceful, lambda name: calls.append(("abort", name)))
    with Signals.install(lambda signum, frame: signals(signum)):
        os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [("graceful", "SIGTERM"), ("abort", "SIGTERM")]


def test_signals_are_installed_in_the_main_thread_and_restored():
    got: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with Signals.install(lambda signum, frame: got.append(signum)):
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by the installed handler
    assert got == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before

    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(Signals.install(lambda s, f: None)._previous))
    t.start()
    t.join()
    assert seen == [{}]  # not the main thread: nothing installed
    with Signals.install(lambda s, f: None, enabled=False) as off:
        assert off._previous == {} and signal.getsignal(signal.SIGTERM) is before
