"""The asyncio worker: every handler of one worker process on one event loop, on a handful of
connections (``await aapp.run_async_worker(...)``; ``AsyncWorker(app, ...).run()``).

All its connections come from one pool of at most ``max_connections`` (the backend's
``async_leasing``). It runs as many jobs at once as ``concurrency`` allows:

- **Claimed lease** (``lease="claimed"``): one claimer task locks up to the free slots' worth of
  jobs in a short transaction, marks each ``running`` with its own owner token and a lease
  (``start_claimed``, pipelined) and commits; the attempt is then durable and the connection goes
  back to the pool. An in-flight job holds **no connection**: one heartbeat task renews every lease
  in flight in one statement per beat (a third of the shortest lease), and the finishing write is
  fenced on state and owner (``complete`` / ``record_outcome`` with the owner) from a pooled
  connection. A lease the heartbeat finds lost (rescued after a pause, or cancelled with
  ``cancel_job``) cancels the handler's task; its write would be refused anyway. A killed
  process's jobs stop being renewed and come back at rescue (every worker runs the rescuer).
  ``job.conn`` is None.
- **Transaction lease** (the default): each running job holds one pooled connection whose
  transaction is the lease (``job.conn``, a psycopg ``AsyncConnection``). The attempt is counted
  first in its own short transaction (``start_attempt``); the handler runs inside a SAVEPOINT
  taken before it starts; ``done`` is written in the same transaction after the savepoint is
  released and committed with the handler's writes, or the savepoint is rolled back and the
  outcome written there, so nobody can claim the job between the rollback and the record of why.
  A killed process's sessions end and the server rolls their jobs back at once. So
  ``max_connections - 2`` bounds how many transaction-lease jobs run at once.
- Sync handlers run in a thread (``asyncio.to_thread``); outcomes, retries, timeouts
  (aio_handler.py) and the failure decisions are the sync worker's (failures.py).

One poison job, one victim (transaction lease): an attempt that never finished shared its process
with other jobs, so it is not charged; the job is then a suspect and its next attempt runs alone in
its process (``AsyncRunGate``), where a crash is its own and charged -- a job that kills its worker
every time ends ``failed`` within ``max_attempts + 1`` runs.

The modules: this one (the worker: its pool, slots, loops and presence), aio_claimed.py (the claimed
lease's runs), aio_txn.py (the transaction lease's runs), gate.py (``AsyncRunGate``), aio_handler.py
(running one handler).

Not (yet) here, compared with the sync worker: batches, LISTEN wake-ups (it polls every
``poll_interval`` when idle) and hooks/metrics/tracing. Its row in ``workers``
(worker/presence.py) is written before it claims, refreshed, and deleted when it exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ConfigurationError, ConnectionLost, DatabaseError, DatabaseUnavailable
from ..reconnect import Backoff
from .aio_claimed import ClaimedLeaseRuns
from .aio_txn import TransactionLeaseRuns
from .flow import REFRESH_SECONDS
from .gate import AsyncRunGate
from .presence import SEEN_INTERVAL
from .queue_view import QueueView
from .schema_watch import SCHEMA_CHECK_INTERVAL, SchemaCheck, check_interval
from .stats import WorkerStats

# How often the asyncio worker tries to delete the rows of queues whose limits were cleared (the
# threaded worker's rescuer pass does it as often: its default rescue_interval).
RETIRE_SECONDS = 5.0

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.worker")

RESERVED = 2  # pooled connections kept from transaction-lease jobs: the claim and the finishing writes
RETRY_CAP = 30.0  # the most a claim loop waits after a refused statement (the threaded worker's max_reconnect_delay)
# ... and after a lost connection: the pool waits for the server itself (its connection() blocks until
# it has reconnected), so a short pause is enough to end a busy loop without delaying the resume after
# an outage by up to RETRY_CAP.
LOST_RETRY_CAP = 1.0


class AsyncWorker:
    """One asyncio worker: ``await worker.run(stop_when_empty=...)``; ``worker.stop()`` drains it."""

    def __init__(self, app: "App", queues: Sequence[str] | None = None, concurrency: int = 100, *,
                 max_connections: int = 10, poll_interval: float = 0.25, rescue_interval: float = 5.0,
                 name: str | None = None, schema_check_interval: float = SCHEMA_CHECK_INTERVAL):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.app = app
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.max_connections = max_connections
        self.poll_interval = poll_interval
        self.rescue_interval = rescue_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:aio"
        self.schema_check_interval = check_interval(schema_check_interval)
        self.schema: SchemaCheck | None = None  # the schema watch's findings (schema_watch.py): set by run()
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()
        self._last_done = asyncio.Event()  # the last job in flight finished: an idle claimer looks again now
        self._finished = 0  # jobs finished so far: a claim that began before one finished may have missed its retry
        self.leasing: Any = None
        self.gate = AsyncRunGate()
        self.claimed = ClaimedLeaseRuns(self)  # aio_claimed.py
        # a worker of every queue: the queues its claims name while one is paused (queue_view.py)
        self.queue_view = QueueView() if self.queues is None else None
        self.transaction = TransactionLeaseRuns(self)  # aio_txn.py

    def stop(self) -> None:
        """Stop claiming; the jobs in flight finish (``run`` returns once they have)."""
        self._stopping.set()

    async def claim(self, conn: Any, names: Sequence[str], limit: int) -> list[Any]:
        """Up to ``limit`` jobs of the tasks ``names`` in ``conn``'s transaction: of this worker's
        queues -- for a worker of every queue, the queues its view names while one is paused, read
        again after such a claim came back empty (worker/queue_view.py, as the sync worker's claims)."""
        leasing, view = self.leasing, self.queue_view
        if view is None:
            return await leasing.claim(conn, self.queues, names, limit)
        named = view.update(*await leasing.claimable_queues(conn, view.most)) if view.take_read() else view.named
        batch = await leasing.claim(conn, named, names, limit)
        if not batch and named is not None:
            again = view.update(*await leasing.claimable_queues(conn, view.most))
            if again != named:
                batch = await leasing.claim(conn, again, names, limit)
        return batch

    async def run(self, stop_when_empty: bool = False) -> WorkerStats:
        app = self.app
        backend = app._ready()
        tasks = app.tasks
        claimed_tasks = sorted(n for n, t in tasks.items() if t.lease == "claimed")
        txn_tasks = sorted(n for n, t in tasks.items() if t.lease != "claimed")
        if not tasks:
            raise ValueError("the app has no tasks registered: nothing to run")
        limited = sorted(n for n, t in tasks.items() if t.limited)
        if limited:  # no flow claim here (worker/flow.py): such jobs would run without their slots
            raise ConfigurationError(f"tasks with flow limits (concurrency, rate, partition_by: {', '.join(limited)}) "
                                     f"are not run by the asyncio worker yet: run them on App.worker()")
        opener = getattr(backend, "async_leasing", None)
        if opener is None:
            raise ConfigurationError(f"the asyncio worker (run_async_worker) runs on PostgreSQL only: "
                                     f"{type(backend).__name__} has no asyncio lease verbs; run `await "
                                     f"aapp.run_worker(...)` (the threaded worker, async def handlers "
                                     f"included) or App.worker() instead")
        self.leasing = leasing = opener(self.max_connections)
        await leasing.open()
        self._slots = asyncio.Semaphore(self.concurrency)
        loops: list[asyncio.Task[Any]] = []
        presence = uuid.uuid4()
        try:
            await self._seen(presence)  # before anything is claimed (worker/presence.py)
            # Runtime task limits (`skiplock limit --task`): this worker has no flow claim, so it
            # leaves a task that has one to a threaded worker -- read before the first claim, then
            # every REFRESH_SECONDS, as the threaded worker re-reads them.
            has_claimed, has_txn = bool(claimed_tasks), bool(txn_tasks)
            beat = min((tasks[n].lease_seconds for n in claimed_tasks), default=0.0) / 3
            claimable = _Claimable(app, claimed_tasks, txn_tasks)
            await claimable.refresh()
            if has_claimed:
                loops.append(asyncio.ensure_future(self.claimed.claim_loop(claimed_tasks, stop_when_empty)))
                services = [asyncio.ensure_future(self.claimed.heartbeat_loop(beat)),
                            asyncio.ensure_future(self.claimed.rescue_loop())]
                services += [asyncio.ensure_future(self.claimed.complete_loop())
                             for _ in range(max(1, min(4, self.max_connections - RESERVED)))]
            else:
                services = []
            services.append(asyncio.ensure_future(self._presence_loop(presence)))
            self.schema = SchemaCheck(app.backend, self.name)
            services.append(asyncio.ensure_future(self._schema_loop(self.schema)))
            services.append(asyncio.ensure_future(claimable.loop()))
            runners = max(1, min(self.concurrency, self.max_connections - RESERVED))
            if has_txn:
                services.append(asyncio.ensure_future(self.transaction.watch_loop()))
                loops += [asyncio.ensure_future(self.transaction.run_loop(txn_tasks, stop_when_empty)) for _ in range(runners)]
            try:
                await asyncio.gather(*loops)
            except asyncio.CancelledError:
                self.stop()
                await asyncio.gather(*loops, return_exceptions=True)
                raise
            finally:
                if self._running:
                    await asyncio.gather(*self._running, return_exceptions=True)
                for service in services:
                    service.cancel()
                await asyncio.gather(*services, return_exceptions=True)
        finally:
            try:
                await leasing.worker_gone(presence)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("could not remove this worker's row from the workers table (%s)", exc)
            await leasing.close()
        return self.stats

    async def _seen(self, presence: uuid.UUID) -> None:
        await self.leasing.worker_seen(presence, self.name, sorted(self.app.tasks), self.queues,
                                       socket.gethostname(), os.getpid(), self.concurrency)

    async def _presence_loop(self, presence: uuid.UUID) -> None:
        while True:
            await asyncio.sleep(SEEN_INTERVAL)
            try:
                await self._seen(presence)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: presence refresh failed (%s)", self.name, exc)

    async def _schema_loop(self, schema: SchemaCheck) -> None:
        """The threaded worker's schema watch (worker/schema_watch.py), its check in a thread."""
        while True:
            await asyncio.sleep(self.schema_check_interval)
            try:
                await asyncio.to_thread(schema.check)
            except (ConnectionLost, DatabaseError, DatabaseUnavailable) as exc:
                log.debug("asyncio worker %s: schema check failed (%s)", self.name, exc)

    @staticmethod
    def retry_backoff() -> Backoff:
        """A claim loop's backoff after failures (``_failed``)."""
        return Backoff(cap=RETRY_CAP)

    def _failed(self, backoff: Backoff, what: str, exc: BaseException) -> float:
        """A claim, or a job's session, failed (a lost connection, a statement the server refused):
        log it and return how long to wait before the next try -- full-jitter backoff, doubling up to
        ``RETRY_CAP`` seconds while the failures go on (``backoff.reset()`` after a success), at most
        ``LOST_RETRY_CAP`` after a lost connection. A loop that tried again at once sent a claim the
        server refuses every time (a schema changed under the worker, say) thousands of times a
        second, each with a WARNING."""
        delay = backoff.next()
        if isinstance(exc, ConnectionLost):
            delay = min(delay, LOST_RETRY_CAP)
        log.warning("asyncio worker %s: %s (%s); trying again in %.2fs", self.name, what, exc, delay)
        return delay

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the worker is stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _idle(self) -> None:
        """Wait ``poll_interval``, or less: until stopped, or until the last job in flight finished."""
        self._last_done.clear()
        waits = [asyncio.ensure_future(self._stopping.wait()), asyncio.ensure_future(self._last_done.wait())]
        try:
            await asyncio.wait(waits, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _empty(self, finished_before: int) -> bool:
        """Nothing in flight, and no job finished since the claim that found nothing began (its retry
        or snooze may have committed after that claim's snapshot)."""
        return not self._running and self._finished == finished_before

    def _track(self, run: "asyncio.Task[Any]") -> None:
        self._running.add(run)
        run.add_done_callback(self._running.discard)



class _Claimable:
    """The task names the asyncio worker's claims pass (the lists its claim loops hold, changed in
    place): every task of its kind except those with limits set at runtime (``task_limits``,
    migration 16), which this worker cannot enforce -- their jobs stay queued for a threaded worker
    (``App.worker()``), never run past their limit. Each change is logged once, at WARNING."""

    def __init__(self, app: Any, claimed: list[str], txn: list[str]):
        self.app = app
        self.lists = [(claimed, list(claimed)), (txn, list(txn))]  # (the loop's list, every name)
        self.limited: set[str] = set()
        self._retire_at = 0.0  # the next retirement pass (monotonic time)

    async def refresh(self) -> None:
        backend = self.app._ready()
        if not backend.capabilities.flow_control:
            return
        now = time.monotonic()
        if now >= self._retire_at:  # as the threaded worker's rescuer pass does (maintenance/rescuer.py):
            # a queue whose limits were cleared is served by the plain claims -- this worker's too --
            # once its row is gone (migration 17)
            self._retire_at = now + RETIRE_SECONDS
            for queue in await asyncio.to_thread(backend.retire_queue_limits):
                log.info("queue %s: its cleared limits are gone; the plain claims serve it again", queue)
        rows = await asyncio.to_thread(backend.task_limits)
        limited = {r[0] for r in rows if r[0] in self.app.tasks and (r[1] is not None or r[2] is not None)}
        if limited == self.limited:
            return
        for name in sorted(limited - self.limited):
            log.warning("task %s has a limit set at runtime; the asyncio worker has no flow claim and leaves "
                        "its jobs queued for a threaded worker (App.worker())", name)
        for name in sorted(self.limited - limited):
            log.warning("task %s has no runtime limit any more; the asyncio worker runs its jobs again", name)
        self.limited = limited
        for current, every in self.lists:
            current[:] = [n for n in every if n not in limited]

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await self.refresh()
            except (ConnectionLost, DatabaseError, DatabaseUnavailable) as exc:
                log.debug("asyncio worker: reading runtime task limits failed (%s); the last ones stand", exc)
