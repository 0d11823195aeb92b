"""A tiny app for tests/security: one task, so a worker has something to run and log."""

import skiplock

app = skiplock.App()


@app.task(name="noop")
def noop(job):
    return None
