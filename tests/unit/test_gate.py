"""The run gate: handlers run shared; an exclusive run waits for the shared ones to end, and no shared
run starts while it waits or runs. Real threads, no database."""

from __future__ import annotations

import threading
import time

from skiplock.worker.gate import RunGate

from support import wait_for


def test_an_exclusive_run_waits_for_shared_runs_and_blocks_new_ones():
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
        with gate.shared():  # as a slot does: it holds the gate shared when it finds its job is a suspect
            with gate.exclusive():
                events.append("exclusive in")
                time.sleep(0.05)
                events.append("exclusive out")

    first = threading.Thread(target=shared_run, args=("first", release_first, first_in))
    first.start()
    assert first_in.wait(10)
    excl = threading.Thread(target=exclusive_run)
    excl.start()
    wait_for(lambda: gate._waiting == 1, 10, "the exclusive run to wait")
    late = threading.Thread(target=shared_run, args=("late",))
    late.start()
    time.sleep(0.05)
    assert events == ["first in"]  # neither the exclusive run nor the late shared one has started
    stopping = threading.Event()
    opened = threading.Event()
    threading.Thread(target=lambda: (gate.wait_open(stopping), opened.set())).start()
    assert not opened.wait(0.05)  # a slot would not claim now either
    release_first.set()
    for t in (first, excl, late):
        t.join(10)
    assert events == ["first in", "first out", "exclusive in", "exclusive out", "late in", "late out"]
    assert opened.wait(10)
