"""A background loop as a small service: start/stop, one pass at a time, and an event per pass so
tests wait on it instead of sleeping."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..backend.postgres.backend import CONNECTION_LOST
from ..errors import DatabaseUnavailable

if TYPE_CHECKING:
    from ..reconnect import Reconnects

log = logging.getLogger("skiplock.maintenance")


class Service:
    """Runs ``step()`` every ``interval`` seconds in a daemon thread until stopped. A failing pass is
    logged and retried at the next interval; it never kills the service. With ``recovery`` (set by
    the worker that runs it), a pass that failed for want of the database is reported as part of the
    worker's outage (one log line for all of its loops) and the next pass runs as soon as the server
    is seen back, instead of at the next interval."""

    name = "service"

    def __init__(self, interval: float):
        self.interval = interval
        self.passes = 0
        self._stop = threading.Event()
        self._pass_done = threading.Condition()
        self._thread: threading.Thread | None = None
        self.recovery: "Reconnects | None" = None

    def step(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def next_delay(self) -> float:
        """Seconds from the end of a pass to the next one: ``interval`` unless a service paces
        itself (the pruner). Not used after a pass lost the database (see ``recovery``)."""
        return self.interval

    def start(self) -> "Service":
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"skiplock-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_for_passes(self, n: int, timeout: float = 10.0) -> bool:
        """Block until ``n`` passes have completed (for tests)."""
        with self._pass_done:
            return self._pass_done.wait_for(lambda: self.passes >= n, timeout)

    def _run(self) -> None:
        failed = False
        while not self._stop.is_set():
            lost: Exception | None = None
            try:
                self.step()
                if failed and self.recovery is not None:
                    self.recovery.connected(self.name)
                failed = False
            except Exception as exc:  # noqa: BLE001 - a pass may fail (database down); try again later
                if isinstance(exc, (*CONNECTION_LOST, DatabaseUnavailable)):
                    lost, failed = exc, True
                if lost is None or self.recovery is None:
                    log.warning("%s pass failed: %s", self.name, exc)
            with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
            if lost is not None and self.recovery is not None:
                self.recovery.lost(self.name, lost, self.interval, self._stop)
            else:
                self._stop.wait(self.next_delay())

