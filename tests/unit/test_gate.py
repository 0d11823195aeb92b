"""The run gate (worker/gate.py): slots hold it shared from claim to COMMIT; an exclusive hold waits for
the shared ones to end, and no shared hold starts while it waits or holds; ``alone`` never waits.
Real threads, no database."""

from __future__ import annotations

import threading
import time

import pytest

from skiplock.worker.gate import RunGate

from support import wait_for


def test_an_exclusive_hold_waits_for_shared_holds_and_blocks_new_ones():
    gate = RunGate()
    events: list[str] = []
    release_first = threading.Event()
    first_in = threading.Event()

    def shared_run(name: str, hold: threading.Event | None = None, entered: threading.Event | None = None) -> None:
        with gate.shared():
            events.append(f"{name} in")
            if entered is not None:
                entered.set()
            if hold is not None:
                hold.wait(10)
            events.append(f"{name} out")

    def exclusive_run() -> None:
        with gate.exclusive():  # as a slot does after letting its transaction go (RunAlone)
            events.append("exclusive in")
            with gate.alone() as alone:  # the suspect found in its claim: this thread holds the gate
                assert alone
            time.sleep(0.05)
            events.append("exclusive out")

    first = threading.Thread(target=shared_run, args=("first", release_first, first_in))
    first.start()
    assert first_in.wait(10)
    excl = threading.Thread(target=exclusive_run)
    excl.start()
    wait_for(lambda: gate._waiting == 1, 10, "the exclusive hold to wait")
    late = threading.Thread(target=shared_run, args=("late",))
    late.start()
    time.sleep(0.05)
    assert events == ["first in"]  # neither the exclusive hold nor the late shared one has started
    stopping = threading.Event()
    opened = threading.Event()
    threading.Thread(target=lambda: (gate.wait_open(stopping), opened.set())).start()
    assert not opened.wait(0.05)  # a slot would not claim now either
    release_first.set()
    for t in (first, excl, late):
        t.join(10)
    assert events == ["first in", "first out", "exclusive in", "exclusive out", "late in", "late out"]
    assert opened.wait(10)


def test_alone_never_waits_it_says_whether_the_gate_is_this_threads_alone():
    gate = RunGate()
    with gate.shared():
        with gate.alone() as alone:  # the only holder: taken at once
            assert alone
            blocked = threading.Event()
            entered = threading.Event()

            def other() -> None:
                blocked.set()
                with gate.shared():
                    entered.set()

            t = threading.Thread(target=other)
            t.start()
            assert blocked.wait(10)
            assert not entered.wait(0.1)  # nobody else takes the gate while it is held alone
        t.join(10)
        assert entered.is_set()

    other_in, release = threading.Event(), threading.Event()

    def holder() -> None:
        with gate.shared():
            other_in.set()
            release.wait(10)

    h = threading.Thread(target=holder)
    h.start()
    assert other_in.wait(10)
    with gate.shared():
        with gate.alone() as alone:  # another slot holds it: no wait (the holder is released only below)
            assert not alone
        assert gate._owner is None
    release.set()
    h.join(10)


def test_an_exclusive_hold_under_a_shared_one_of_the_same_thread_is_refused():
    gate = RunGate()
    with gate.shared():
        with pytest.raises(RuntimeError, match="wait for itself"):
            with gate.exclusive():
                pass
    with gate.exclusive():  # and the gate is not left half-taken
        pass
