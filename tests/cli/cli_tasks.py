"""Tasks for the command-line tests (imported by ``--app cli_tasks:app`` in CLI subprocesses)."""

from __future__ import annotations

import os
import time
from typing import Any

import skiplock
from skiplock.aio import AsyncApp

app = skiplock.App()
aapp = AsyncApp()


@app.task(name="mail.send", queue="mail", priority=3, max_attempts=2)
def send(job: Any, to: str, cc: str | None = None) -> None:
    """Registered options the CLI must apply: queue 'mail', priority 3, 2 attempts."""


@app.task(name="hold")
def hold(job: Any, release: str) -> None:
    """Runs until the file ``release`` exists (at most 60 s): a job that is running while a test looks."""
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task(name="flaky", retry=1.0, max_attempts=3)
def flaky(job: Any) -> None:
    """Fails its first attempt; the retry is due 1 s later."""
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@aapp.task(name="async.ping")
async def ping(job: Any, n: int) -> int:
    return n


@app.task(name="gc.frozen")
def gc_frozen(job: Any) -> int:
    """How many objects this worker process froze out of the garbage collector's walks."""
    import gc

    return gc.get_freeze_count()
