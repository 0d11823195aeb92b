"""A background loop as a small service (the rescuer, the pruner, the scheduler, heartbeats, presence):
the :class:`skiplock.lifecycle.Loop` with one pass every ``interval`` seconds."""

from __future__ import annotations

import logging
import random
from typing import Callable

from ..lifecycle import SYSTEM_CLOCK, Clock, Loop

log = logging.getLogger("skiplock.maintenance")


class Service(Loop):
    """Runs ``step()`` every ``interval`` seconds (``next_delay()``: a service may pace itself, as the
    pruner does) in a daemon thread until stopped. A failing pass is logged and retried after a
    backoff of at most ``interval`` (it never kills the service). With ``recovery`` (set by the
    worker that runs it), a pass that failed for want of the database is reported as part of the
    worker's outage (one log line for all of its loops) and the next pass runs as soon as the server
    is seen back. Events to wait on instead of sleeping: ``started``, ``stopped``,
    :meth:`wait_for_passes`, :meth:`wait_for_failures`, ``last_error`` (see :mod:`skiplock.lifecycle`)."""

    name = "service"
    logger = log

    def __init__(self, interval: float, *, clock: Clock = SYSTEM_CLOCK,
                 rng: Callable[[float, float], float] = random.uniform):
        super().__init__(interval, clock=clock, max_backoff=interval, rng=rng)
