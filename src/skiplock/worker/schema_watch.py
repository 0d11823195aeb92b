"""A running worker's watch on its database's skiplock schema: a worker checks the schema version
once when it starts (``App.check``) and refuses to run on one it does not match; this notices a
migration applied while it runs -- a rolling deploy migrated by a newer release, a schema restored
from an older backup -- and says so.

Every ``SCHEMA_CHECK_INTERVAL`` seconds (``Worker(schema_check_interval=...)``) the worker runs the
same check as at start (``Backend.check_schema``: one short read of the version table). When the
answer changes it logs one line: a WARNING naming the versions and what to do (restart the worker
with the skiplock that matches the schema: docs/deployment.md, "Upgrading"), or, once they match
again, an INFO line. ``problem`` holds the current mismatch (None: none).

Guarantees: it never stops the worker nor changes what it claims -- a worker still running its old
statements against a newer schema is what migrations are written to allow for the length of a
deploy, and stopping every old worker at once would be an outage; it only makes the mismatch visible
(once per change, not once per pass). A pass that cannot reach the database is the worker's outage,
reported with it (``Service``), not a mismatch.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from ..errors import SchemaError
from ..maintenance.service import Service

if TYPE_CHECKING:
    from ..backend.base import Backend

log = logging.getLogger("skiplock.worker")

SCHEMA_CHECK_INTERVAL = 30.0


def check_interval(seconds: float) -> float:
    """``schema_check_interval`` as given, if a positive number of seconds (else ValueError)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise ValueError(f"schema_check_interval must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


class SchemaCheck:
    """The check and what it last found (shared by the threaded and the asyncio worker)."""

    def __init__(self, backend: "Backend", worker: str):
        self.backend = backend
        self.worker = worker
        self.problem: str | None = None

    def check(self) -> str | None:
        """Check the schema now; log a line if the answer changed. Returns the mismatch, if any."""
        try:
            self.backend.check_schema()
            found: str | None = None
        except SchemaError as exc:
            found = str(exc)
        if found != self.problem:
            if found is not None:
                log.warning("worker %s: the database's skiplock schema changed while this worker runs -- %s. "
                            "It goes on claiming with its own statements, which may not fit that schema: "
                            "restart it with the skiplock that matches (docs/deployment.md, \"Upgrading\")",
                            self.worker, found)
            else:
                log.info("worker %s: the skiplock schema matches this worker's skiplock again", self.worker)
        self.problem = found
        return found


class SchemaWatch(Service):
    """``SchemaCheck.check`` every ``interval`` seconds, in the worker's services."""

    name = "schema watch"

    def __init__(self, check: SchemaCheck, interval: float = SCHEMA_CHECK_INTERVAL):
        super().__init__(interval)
        self.schema = check

    def step(self) -> None:
        self.schema.check()
