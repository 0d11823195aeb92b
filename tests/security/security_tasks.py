"""Tasks of the security tests' worker processes (``--app security_tasks:app``)."""

from __future__ import annotations

from typing import Any

import skiplock

app = skiplock.App()


@app.task(name="echo")
def echo(job: Any, n: int) -> dict[str, int]:
    return {"n": n}
