"""Tasks run by the acceptance tests' worker processes (``--app tasks_app:app``).

Every task writes its database-local effect through ``job.conn`` -- a row in the test's ``effects``
table naming the job, the attempt and the worker's pid -- so it commits with the job's completion or
not at all. The CLI's ``--dsn`` configures ``app``; nothing here connects at import time.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import skiplock

app = skiplock.App()

# A second app with a small args limit: the command line cannot carry a 2 MB argument (the kernel caps
# one argv string at 128 KiB), so the CLI's size check is exercised against this one.
SMALL_ARGS_LIMIT = 64 * 1024
small_app = skiplock.App(max_args_bytes=SMALL_ARGS_LIMIT)


def record(job: Any) -> None:
    job.conn.execute("INSERT INTO effects (job_id, attempt, pid) VALUES (%s, %s, %s)",
                     [job.id, job.attempt, os.getpid()])


@app.task(name="effect")
def effect(job: Any, sleep: float = 0.0, **_: Any) -> None:
    """Write the effect, then optionally work a little."""
    record(job)
    if sleep:
        time.sleep(sleep)


small_app.task(name="effect")(effect.fn)


@app.task(name="slow")
def slow(job: Any, seconds: float, first_attempt_only: bool = False) -> None:
    """Write the effect, then sleep (on every attempt, or only on the first)."""
    record(job)
    if not first_attempt_only or job.attempt == 1:
        time.sleep(seconds)


@app.task(name="side")
def side(job: Any, started: str, hold: str = "", sleep: float = 0.0) -> None:
    """Append "job attempt pid" to the file ``started`` (outside the transaction: it survives a kill);
    write the effect (side by side, one such job at a time has the connection: the others wait for
    it); then wait while the file ``hold`` exists (at most a minute), or ``sleep``."""
    with open(started, "a") as f:
        f.write(f"{job.id} {job.attempt} {os.getpid()}\n")
    record(job)
    deadline = time.monotonic() + 60
    while hold and os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.01)
    if sleep:
        time.sleep(sleep)


@app.task(name="suicide", max_attempts=3)
def suicide(job: Any) -> None:
    """A poison job: write the effect, then SIGKILL the worker process running it."""
    record(job)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


@app.task(name="crash_if")
def crash_if(job: Any, crash: bool = False) -> None:
    """Fast (so it is batched), except when asked to SIGKILL its worker: a poison job among batch-mates."""
    record(job)
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached


@app.task(name="raise_base", max_attempts=2, retry=0.0)
def raise_base(job: Any, kind: str) -> None:
    """Write the effect, then raise a BaseException that is not an Exception."""
    record(job)
    if kind == "SystemExit":
        raise SystemExit(f"handler of job {job.id} called sys.exit")
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt(f"handler of job {job.id} raised KeyboardInterrupt")
    raise ValueError(f"unknown kind {kind!r}")
