"""A background loop as a small service: start/stop, one pass at a time, and an event per pass so
tests wait on it instead of sleeping."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("skiplock.maintenance")


class Service:
    """Runs ``step()`` every ``interval`` seconds in a daemon thread until stopped. A failing pass is
    logged and retried at the next interval; it never kills the service."""

    name = "service"

    def __init__(self, interval: float):
        self.interval = interval
        self.passes = 0
        self._stop = threading.Event()
        self._pass_done = threading.Condition()
        self._thread: threading.Thread | None = None

    def step(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

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
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a pass may fail (database down); try again later
                log.warning("%s pass failed: %s", self.name, exc)
            with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
            self._stop.wait(self.interval)

