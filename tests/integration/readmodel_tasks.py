"""Tasks for tests/integration/test_read_model.py's worker processes (``--app readmodel_tasks:app``).

``hold`` blocks until the test creates the file ``gate`` (an event across processes), so the test
decides how long the job is in flight; the deadline is only a safety net."""

from __future__ import annotations

import os
import time
from typing import Any

import skiplock

app = skiplock.App()


def wait_for_gate(gate: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


@app.task(name="hold")
def hold(job: Any, gate: str) -> str:
    """Transaction lease: in flight, its row locked and still 'queued', until the gate opens."""
    wait_for_gate(gate)
    return "released"


@app.task(name="hold_claimed", lease="claimed", lease_seconds=30)
def hold_claimed(job: Any, gate: str) -> str:
    """Claimed lease: 'running' (committed) until the gate opens."""
    wait_for_gate(gate)
    return "released"


@app.task(name="fail_with")
def fail_with(job: Any, kind: str) -> None:
    raise {"ValueError": ValueError, "KeyError": KeyError}[kind]("on purpose")
