"""The worker: ``concurrency`` slots in one process, each a thread with its own lease connection.

Several worker processes cooperate through SKIP LOCKED alone; there is no coordinator.
Shutdown: the first SIGINT/SIGTERM (or :meth:`Worker.stop`) stops claiming and lets in-flight
jobs finish; a second one (or ``stop(abort=True)``) terminates the in-flight jobs' database sessions,
so their transactions roll back and the jobs return to the queue: nothing is lost.
A lost database connection is logged and retried with capped exponential backoff.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from ..backend.postgres.backend import CONNECTION_LOST
from ..errors import DatabaseUnavailable
from ..job import Cancelled, Done, Failed, LeaseLost, RetryLater, Snoozed
from ..maintenance.periodic import Scheduler
from ..maintenance.pruner import Pruner
from ..maintenance.rescuer import Rescuer
from ..maintenance.service import Service
from .executor import Executor
from .heartbeat import Heartbeat
from .listener import Listener

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.worker")


@dataclass
class WorkerStats:
    done: int = 0
    retried: int = 0
    failed: int = 0
    snoozed: int = 0
    cancelled: int = 0
    lost: int = 0
    reconnects: int = 0
    aborted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, outcome: object) -> None:
        with self._lock:
            if isinstance(outcome, Done):
                self.done += 1
            elif isinstance(outcome, RetryLater):
                self.retried += 1
            elif isinstance(outcome, Failed):
                self.failed += 1
            elif isinstance(outcome, Snoozed):
                self.snoozed += 1
            elif isinstance(outcome, Cancelled):
                self.cancelled += 1
            elif isinstance(outcome, LeaseLost):
                self.lost += 1


class Worker:
    """Claims and runs jobs. Create it with :meth:`App.worker`."""

    def __init__(self, app: "App", queues: Sequence[str] | None = None, concurrency: int = 4, *,
                 poll_interval: float = 0.5, name: str | None = None, handle_signals: bool = True,
                 max_reconnect_delay: float = 30.0, maintenance: bool = True, prune_interval: float = 60.0,
                 batch_size: int = 1, batch_budget: float = 0.05, listen: bool = True,
                 rescue_interval: float = 5.0):
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        if queues is not None:
            if isinstance(queues, str):
                queues = [queues]
            queues = list(queues)
            if not queues or not all(isinstance(q, str) and q for q in queues):
                raise ValueError(f"queues must be a list of non-empty names, got {queues!r}")
        self.app = app
        self.queues = queues
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.handle_signals = handle_signals
        self.max_reconnect_delay = max_reconnect_delay
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ValueError(f"batch_size must be an integer from 1 to 1000, got {batch_size!r}")
        self.batch_size = batch_size
        self.batch_budget = batch_budget
        self.rescue_interval = rescue_interval
        self.listen = listen
        self.listener: Listener | None = None
        self._wake_up = threading.Condition()
        self.maintenance = maintenance
        self.prune_interval = prune_interval
        self.services: list[Service] = []
        self.stats = WorkerStats()
        self.started = threading.Event()
        self._stopping = threading.Event()
        self._conns: dict[int, psycopg.Connection[Any]] = {}
        self._busy: set[int] = set()
        self._signals = 0

    # ---- control -------------------------------------------------------------------------------

    def wake(self) -> None:
        """Wake idle slots to claim now (called on NOTIFY)."""
        with self._wake_up:
            self._wake_up.notify_all()

    def _idle(self) -> None:
        with self._wake_up:
            if not self._stopping.is_set():
                self._wake_up.wait(self.poll_interval)

    def stop(self, abort: bool = False) -> None:
        """Stop claiming. With ``abort``, also end in-flight jobs: their transactions roll back."""
        self._stopping.set()
        self.wake()
        if abort and not self.stats.aborted:
            self.stats.aborted = True
            pids = [c.info.backend_pid for i, c in list(self._conns.items()) if i in self._busy and not c.closed]
            log.warning("aborting %d in-flight job(s); their transactions roll back and the jobs stay queued", len(pids))
            try:
                self.app.backend.terminate(pids)
            except (DatabaseUnavailable, psycopg.Error) as exc:
                log.warning("could not terminate in-flight sessions (%s); they end when this process exits", exc)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning("received %s: finishing in-flight jobs, claiming no more (signal again to abort them)",
                        signal.Signals(signum).name)
            self.stop()
        else:
            self.stop(abort=True)

    # ---- running -------------------------------------------------------------------------------

    def run(self, stop_when_empty: bool = False) -> WorkerStats:
        """Run until stopped (or, with ``stop_when_empty``, until no job is available)."""
        self.app._ready()  # clear error now if the database or schema is not usable
        self._stop_when_empty = stop_when_empty
        claimed_leases = [t.lease_seconds for t in self.app.tasks.values() if t.lease == "claimed"]
        heartbeat = Heartbeat(self.app.backend, min(claimed_leases) / 3) if claimed_leases else None
        executor = Executor(self.app, self.name, heartbeat)
        previous: dict[int, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        if heartbeat is not None:
            self.services.append(heartbeat)
        if self.maintenance:
            self.services.append(Rescuer(self.app, self.rescue_interval))
            if self.app.schedules:
                self.services.append(Scheduler(self.app))
            self.services.append(Pruner(self.app, self.prune_interval))
        threads = [threading.Thread(target=self._slot, args=(i, executor), name=f"skiplock-slot-{i}", daemon=True)
                   for i in range(self.concurrency)]
        if self.listen:
            backend = self.app.backend
            self.listener = Listener(backend.connect_listener, backend.wake_payload, self.wake, self._stopping)
        try:
            if self.listener is not None:
                self.listener.start()
            for service in self.services:
                service.start()
            for t in threads:
                t.start()
            self.started.set()
            aborted_at: float | None = None
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.1)
                if self.stats.aborted:
                    aborted_at = aborted_at or time.monotonic()
                    if time.monotonic() - aborted_at > 2.0:
                        log.warning("in-flight handlers did not return after abort; leaving them (their sessions are gone)")
                        break
        finally:
            self._stopping.set()
            if self.listener is not None:
                self.listener.stop()
            for service in self.services:
                service.stop()
            executor.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.stats

    def _slot(self, index: int, executor: Executor) -> None:
        slot_name = f"{self.name}/{index}"
        backend = self.app.backend
        conn: psycopg.Connection[Any] | None = None
        delay = 0.0
        try:
            while not self._stopping.is_set():
                try:
                    if conn is not None and conn.closed:  # closed on purpose (a timed-out job)
                        conn = None
                    if conn is None:
                        conn = backend.connect_lease(f"skiplock-worker {slot_name}")
                        self._conns[index] = conn
                        if delay:
                            log.warning("slot %s: reconnected to the database", slot_name)
                    claimed = backend.claim(conn, self.queues, self.batch_size, savepoint=True)
                    if not claimed:
                        conn.rollback()
                        if self._stop_when_empty:
                            return
                        self._idle()
                        continue
                    self._busy.add(index)
                    try:
                        for outcome in executor.run_batch(conn, claimed, slot_name, self.batch_budget, self._stopping):
                            self.stats.count(outcome)
                    finally:
                        self._busy.discard(index)
                    delay = 0.0
                except Exception as exc:  # noqa: BLE001 - a slot never dies; it reconnects with backoff
                    if self.stats.aborted:
                        return
                    delay = min(self.max_reconnect_delay, max(0.25, delay * 2))
                    self.stats.reconnects += 1
                    if isinstance(exc, (*CONNECTION_LOST, DatabaseUnavailable)):
                        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        log.warning("slot %s: database connection lost (%s); reconnecting in %.2fs",
                                    slot_name, reason, delay)
                    else:
                        log.exception("slot %s: unexpected error; reconnecting in %.2fs", slot_name, delay)
                    if conn is not None:
                        conn.close()
                        conn = None
                    self._stopping.wait(delay)
        finally:
            if conn is not None:
                conn.close()
            self._conns.pop(index, None)
