"""Wake-ups: one LISTEN connection per worker process turns enqueue NOTIFYs into slot wake-ups.

NOTIFY is a hint, never the source of truth: slots still poll every ``poll_interval``, and after the
listener (re)connects it wakes every slot once, so a notification lost while it was disconnected
costs at most one poll interval. A dead listener connection raises on its next read (TCP keepalives
bound how long that takes); it is then reconnected and re-LISTENs, waiting like every other
reconnecting loop (``skiplock.reconnect``: full-jitter backoff, woken early when the process's
readiness probe sees the server back, one log line per outage for its owner).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import psycopg

from ..errors import DatabaseUnavailable
from ..reconnect import Reconnects

log = logging.getLogger("skiplock.listener")


class Listener:
    def __init__(self, connect: Callable[[], psycopg.Connection], payload: str, wake: Callable[[bool], None],
                 stopping: threading.Event, max_backoff: float = 30.0, *, recovery: Reconnects | None = None):
        self._connect = connect
        self._payload = payload
        self._wake = wake
        self._stopping = stopping
        # The owner's (a worker's, a relay's), so an outage is reported once for all of its loops.
        self._recovery = recovery if recovery is not None else Reconnects(None, log, cap=max_backoff)
        self.notifications = 0
        self.reconnects = 0
        self.listening = threading.Event()  # set while a LISTEN connection is up
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="skiplock-listener", daemon=True)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Returns within a quarter of a second: the listener re-checks ``stopping`` between reads."""
        self._thread.join(5)

    def _run(self) -> None:
        backoff = self._recovery.backoff()
        while not self._stopping.is_set():
            try:
                self._conn = self._connect()
                self.listening.set()
                if backoff.failures:
                    log.debug("listener reconnected; polling once for anything missed")
                    self._recovery.connected("listener", backoff)
                self._wake(True)  # every slot: anything enqueued while we were not listening is found
                while not self._stopping.is_set():
                    for note in self._conn.notifies(timeout=0.25):
                        if note.payload == self._payload:
                            self.notifications += 1
                            self._wake(False)  # one slot; it wakes the next if it finds more
            except (psycopg.Error, DatabaseUnavailable) as exc:
                self.listening.clear()
                if self._stopping.is_set():
                    break
                self.reconnects += 1
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._recovery.lost("listener", exc, backoff.next(), self._stopping)  # slots poll meanwhile
            finally:
                self.listening.clear()
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
