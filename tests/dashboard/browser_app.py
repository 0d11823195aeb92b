"""The app of the browser test (imported by the dashboard's ``--app`` and by the test's worker):
``flaky`` fails while the file its args name exists; ``slow`` runs until the file its args name is
gone; a periodic task gives the cron page a row."""

from __future__ import annotations

import os
import time

import skiplock

app = skiplock.App()


@app.task(name="flaky", max_attempts=1)
def flaky(job, flag: str, n: int = 0):
    if os.path.exists(flag):
        raise ValueError(f"flaky {n}: flag {flag} is set")
    return {"n": n}


@app.task(name="slow")
def slow(job, hold: str):
    deadline = time.monotonic() + 60  # a safety net: the test removes the file
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


@app.periodic("0 3 * * *", name="nightly_report")
def nightly_report(job):
    pass
