"""Wake-ups: one LISTEN connection per worker process turns enqueue NOTIFYs into slot wake-ups.

NOTIFY is a hint, never the source of truth: slots still poll every ``poll_interval``, and after the
listener (re)connects it wakes every slot once, so a notification lost while it was disconnected
costs at most one poll interval. A dead listener connection raises on its next read (TCP keepalives
bound how long that takes); it is then reconnected with backoff and re-LISTENs.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import psycopg

from ..errors import DatabaseUnavailable

log = logging.getLogger("skiplock.listener")


class Listener:
    def __init__(self, connect: Callable[[], psycopg.Connection], payload: str, wake: Callable[[bool], None],
                 stopping: threading.Event, max_backoff: float = 30.0):
        self._connect = connect
        self._payload = payload
        self._wake = wake
        self._stopping = stopping
        self._max_backoff = max_backoff
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
        delay = 0.0
        while not self._stopping.is_set():
            try:
                self._conn = self._connect()
                self.listening.set()
                if delay:
                    log.info("listener reconnected; polling once for anything missed")
                self._wake(True)  # every slot: anything enqueued while we were not listening is found
                delay = 0.0
                while not self._stopping.is_set():
                    for note in self._conn.notifies(timeout=0.25):
                        if note.payload == self._payload:
                            self.notifications += 1
                            self._wake(False)  # one slot; it wakes the next if it finds more
            except (psycopg.Error, DatabaseUnavailable) as exc:
                self.listening.clear()
                if self._stopping.is_set():
                    break
                delay = min(self._max_backoff, max(0.25, delay * 2))
                self.reconnects += 1
                log.warning("listener connection lost (%s); reconnecting in %.2fs (polling meanwhile)",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, delay)
                self._stopping.wait(delay)
            finally:
                self.listening.clear()
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
