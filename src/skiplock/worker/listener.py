"""Wake-ups: one listening session per worker process (or relay) turns NOTIFYs into wake-ups.

NOTIFY is a hint, never the source of truth: slots still poll every ``poll_interval``, and after the
listener (re)connects it wakes every slot once, so a notification lost while it was disconnected
costs at most one poll interval. A dead listening session raises ``ConnectionLost`` on its next wait
(TCP keepalives bound how long that takes); it is then reconnected and re-LISTENs, waiting like every
other loop (:mod:`skiplock.lifecycle`: full-jitter backoff, woken early when the process's readiness
probe sees the server back, one log line per outage for its owner).

Driver-free: the session is the backend's :class:`~skiplock.backend.base.Notifications`
(``connect_listener``), which raises only skiplock errors.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..backend.base import Notifications
from ..lifecycle import Loop
from ..reconnect import Reconnects

log = logging.getLogger("skiplock.listener")

# Seconds one pass waits for a notification; a stop is seen within it.
WAIT = 0.25


class Listener(Loop):
    """Calls ``wake(False)`` for each notification whose payload is ``payload`` (one slot; it wakes the
    next if it finds more) and ``wake(True)`` after every (re)connect (every slot: anything sent while
    nobody listened is found). Stops with its owner's ``stopping`` event (or :meth:`stop`).
    ``listening`` is set while a session is up; ``notifications`` and ``reconnects`` count."""

    name = "listener"
    logger = log

    def __init__(self, listen: Callable[[], Notifications], payload: str, wake: Callable[[bool], None],
                 stopping: threading.Event, max_backoff: float = 30.0, *, recovery: Reconnects | None = None):
        super().__init__(0.0, max_backoff=max_backoff, stopping=stopping)
        self._listen = listen
        self._payload = payload
        self._wake_up = wake
        # The owner's (a worker's, a relay's), so an outage is reported once for all of its loops.
        self.recovery = recovery if recovery is not None else Reconnects(None, log, cap=max_backoff)
        self.notifications = 0
        self.reconnects = 0
        self.listening = threading.Event()  # set while a listening session is up
        self._session: Notifications | None = None

    def step(self) -> None:
        if self._session is None:
            self._session = self._listen()
            self.listening.set()
            if self.failures:
                log.debug("listener reconnected; polling once for anything missed")
            self.recovered()
            self._wake_up(True)
        for payload in self._session.wait(WAIT):
            if payload == self._payload:
                self.notifications += 1
                self._wake_up(False)

    def on_failure(self, exc: BaseException) -> None:
        if not self.stopping:
            self.reconnects += 1  # slots poll meanwhile
        self._close()

    def on_stop(self) -> None:
        self._close()

    def _close(self) -> None:
        self.listening.clear()
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - a dead session may refuse even that
                pass
