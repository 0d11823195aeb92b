"""The rescuer: claimed-lease jobs whose lease expired (their worker died, hung or was paused) go back
to the queue, or to 'failed' with the reason 'lease expired' after their last attempt.

Every worker runs one; they never step on each other (SKIP LOCKED) and a rescued job's late worker
cannot overwrite the newer outcome (its finishing writes are fenced on state and owner).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .service import Service

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.rescuer")


class Rescuer(Service):
    name = "rescuer"

    def __init__(self, app: "App", interval: float = 5.0, batch: int = 1000):
        super().__init__(interval)
        self.app = app
        self.batch = batch
        self.rescued: list[tuple[int, str]] = []

    def step(self) -> None:
        while True:
            rows = self.app.backend.rescue_expired(self.batch)
            for job_id, state in rows:
                log.warning("job %s: lease expired; %s", job_id, "queued again" if state == "queued" else "failed")
            self.rescued.extend(rows)
            if len(rows) < self.batch:
                break
        backend = self.app.backend
        if backend.capabilities.flow_control:  # flow control: slots a finishing write could not free
            backend.release_stale_slots()  # type: ignore[attr-defined]  # base.FlowBackend
            # and the rows of queues whose limits were cleared, once none of their jobs is flagged
            for queue in backend.retire_queue_limits():  # type: ignore[attr-defined]  # base.FlowBackend
                log.info("queue %s: its cleared limits are gone; the plain claims serve it again", queue)
