"""A second application sharing the database and queues with tasks_app (``--app app_b:app``): its task
names are its own, so a tasks_app worker must leave its jobs alone."""

from __future__ import annotations

from typing import Any

import skiplock
from tasks_app import record

app = skiplock.App()


@app.task(name="b.effect")
def b_effect(job: Any) -> None:
    record(job)
