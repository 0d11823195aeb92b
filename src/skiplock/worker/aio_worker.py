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

Not (yet) here, compared with the sync worker: batches, LISTEN wake-ups (it polls every
``poll_interval`` when idle) and hooks/metrics/tracing. Its row in ``workers``
(worker/presence.py) is written before it claims, refreshed, and deleted when it exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

from ..backend.base import ClaimedJob
from ..errors import ConfigurationError, ConnectionLost, DatabaseError
from ..job import Cancelled, Done, Failed, LeaseLost, Outcome
from .aio_handler import make_async_job, run_handler
from .completer import CANCELLED_WHILE_RUNNING, _as_written, _row_for
from .failures import decide_failure, format_error
from .loop import WorkerStats
from .presence import SEEN_INTERVAL

if TYPE_CHECKING:
    from ..app import App, Task

log = logging.getLogger("skiplock.worker")

class AsyncRunGate:
    """The process's run gate on its event loop (the sync worker's gate.py, for tasks): handlers run
    ``shared``; a suspect's handler runs ``exclusive`` -- it waits until no other handler of the process
    runs, and none starts until it is done (a waiting exclusive run goes before new shared ones) -- so
    if the process dies then, the crash is its own and its attempt is charged."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()


RESERVED = 2  # pooled connections kept from transaction-lease jobs: the claim and the finishing writes


class AsyncWorker:
    """One asyncio worker: ``await worker.run(stop_when_empty=...)``; ``worker.stop()`` drains it."""

    def __init__(self, app: "App", queues: Sequence[str] | None = None, concurrency: int = 100, *,
                 max_connections: int = 10, poll_interval: float = 0.25, rescue_interval: float = 5.0,
                 name: str | None = None):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.app = app
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.max_connections = max_connections
        self.poll_interval = poll_interval
        self.rescue_interval = rescue_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:aio"
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()
        self._held: dict[int, tuple[uuid.UUID, float, asyncio.Task[Any]]] = {}  # claimed leases in flight
        self._lost: set[int] = set()
        self._txn_held: dict[int, asyncio.Task[Any]] = {}  # transaction-lease jobs in flight
        self._cancel_asked: set[int] = set()
        self._to_complete: list[tuple[Any, asyncio.Future[bool]]] = []  # claimed-lease `done` writes waiting
        self._complete_wake = asyncio.Event()
        self._last_done = asyncio.Event()  # the last job in flight finished: an idle claimer looks again now
        self._finished = 0  # jobs finished so far: a claim that began before one finished may have missed its retry
        self.leasing: Any = None
        self.gate = AsyncRunGate()

    def stop(self) -> None:
        """Stop claiming; the jobs in flight finish (``run`` returns once they have)."""
        self._stopping.set()

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
            if claimed_tasks:
                beat = min(tasks[n].lease_seconds for n in claimed_tasks) / 3
                loops.append(asyncio.ensure_future(self._claim_loop(claimed_tasks, stop_when_empty)))
                services = [asyncio.ensure_future(self._heartbeat_loop(beat)),
                            asyncio.ensure_future(self._rescue_loop())]
                services += [asyncio.ensure_future(self._complete_loop())
                             for _ in range(max(1, min(4, self.max_connections - RESERVED)))]
            else:
                services = []
            services.append(asyncio.ensure_future(self._presence_loop(presence)))
            runners = max(1, min(self.concurrency, self.max_connections - RESERVED))
            if txn_tasks:
                services.append(asyncio.ensure_future(self._watch_loop()))
                loops += [asyncio.ensure_future(self._txn_loop(txn_tasks, stop_when_empty)) for _ in range(runners)]
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

    async def _idle(self) -> None:
        """Wait ``poll_interval``, or less: until stopped, or until the last job in flight finished."""
        self._last_done.clear()
        waits = [asyncio.ensure_future(self._stopping.wait()), asyncio.ensure_future(self._last_done.wait())]
        try:
            await asyncio.wait(waits, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # ---- claimed lease -------------------------------------------------------------------------

    async def _claim_loop(self, names: list[str], stop_when_empty: bool) -> None:
        leasing, tasks, slots = self.leasing, self.app.tasks, self._slots
        while not self._stopping.is_set():
            await slots.acquire()  # at least one slot is free
            free = 1
            if self.concurrency >= 20 and self.concurrency - len(self._running) < self.concurrency // 10:
                await asyncio.sleep(0.005)  # jobs are finishing: claim for several slots at once
            while not slots.locked() and free < 1000:
                await slots.acquire()
                free += 1
            finished_before = self._finished
            try:
                started = await self._claim_started(names, free)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: claim failed (%s); retrying", self.name, exc)
                started = []
            for _ in range(free - len(started)):
                slots.release()
            for claimed, owner, begun in started:
                task = tasks[claimed.task]
                run = asyncio.ensure_future(self._run_claimed(claimed, task, owner, begun))
                self._track(run)
            if not started:
                if stop_when_empty and self._empty(finished_before):
                    return
                await self._idle()

    async def _claim_started(self, names: list[str], limit: int) -> list[tuple[ClaimedJob, uuid.UUID, Any]]:
        """Claim and start up to ``limit`` jobs in one short transaction, committed."""
        leasing, tasks = self.leasing, self.app.tasks
        async with leasing.lease() as conn:
            try:
                batch = await leasing.claim(conn, self.queues, names, limit)
                if not batch:
                    await leasing.rollback(conn)
                    return []
                plan = [(c, uuid.uuid4(), tasks[c.task].lease_seconds) for c in batch]
                begun = await leasing.start_claimed_many(conn, plan, self.name)
                await leasing.commit(conn)
            except BaseException:
                if leasing.alive(conn):
                    await leasing.rollback(conn)
                raise
        return [(c, owner, b) for (c, owner, _), b in zip(plan, begun)]

    async def _run_claimed(self, claimed: ClaimedJob, task: "Task", owner: uuid.UUID, begun: Any) -> None:
        try:
            if begun is None:  # not queued any more (cannot happen while we held its lock)
                self.stats.count(LeaseLost(Failed("not queued when claimed")))
                return
            attempt, cancel_reason = begun
            if cancel_reason is not None:
                outcome: Outcome = Cancelled(cancel_reason)
                attempt -= 1
            elif claimed.attempts >= claimed.max_attempts:
                outcome = Failed(f"gave up: {claimed.attempts} attempt(s) used of max_attempts {claimed.max_attempts}; "
                                 "the job is not run again")
            else:
                me = asyncio.current_task()
                assert me is not None
                self._held[claimed.id] = (owner, task.lease_seconds, me)
                try:
                    job = make_async_job(claimed, attempt, self.name, None)
                    async with self.gate.shared():
                        outcome = await run_handler(self.app, task, job, claimed, attempt)
                except asyncio.CancelledError:
                    if claimed.id in self._lost:  # the heartbeat found the lease no longer ours
                        self.stats.count(LeaseLost(Failed("lease lost")))
                        log.warning("job %s: lost its lease (rescued or cancelled meanwhile); its run was stopped",
                                    claimed.id)
                        return
                    raise
                finally:
                    self._held.pop(claimed.id, None)
                    self._lost.discard(claimed.id)
            self.stats.count(await self._finish_fenced(claimed, attempt, outcome, owner))
        except (ConnectionLost, DatabaseError) as exc:
            log.warning("job %s: its outcome could not be written (%s); its lease expires and the rescuer "
                        "returns it", claimed.id, exc)
        finally:
            self._finished += 1
            self._slots.release()
            if len(self._running) <= 1:
                self._last_done.set()

    async def _finish_fenced(self, claimed: ClaimedJob, attempt: int, outcome: Outcome, owner: uuid.UUID) -> Outcome:
        """The claimed lease's finishing write, fenced on state ``running`` and our owner, from a pooled
        connection; a refused write is a lost lease (rescued or cancelled meanwhile)."""
        leasing = self.leasing
        started_at = claimed.claimed_at
        if isinstance(outcome, Done):
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._to_complete.append(((claimed, attempt, outcome.result, started_at, self.name, owner), done))
            self._complete_wake.set()
            if await done:
                return outcome
            return self._lost_lease(claimed, outcome)
        state, delay, error, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1
        written = await leasing.record_outcome(None, claimed, attempt, state=state, delay=delay, error=error,
                                               started_at=started_at, worker=self.name, owner=owner)
        if written is None:
            return self._lost_lease(claimed, outcome)
        return _as_written(outcome, written)

    @staticmethod
    def _lost_lease(claimed: ClaimedJob, outcome: Outcome) -> Outcome:
        log.warning("job %s: lost its lease (rescued or cancelled meanwhile); our finishing write was refused",
                    claimed.id)
        return LeaseLost(outcome)

    async def _complete_loop(self, most: int = 500) -> None:
        """Claimed-lease ``done`` writes, many per round trip and transaction (``complete_many``), each
        fenced on its own row; if that transaction fails, each is written alone (fenced the same way)."""
        leasing = self.leasing
        while True:
            if not self._to_complete:
                self._complete_wake.clear()
                await self._complete_wake.wait()
                continue
            taken, self._to_complete = self._to_complete[:most], self._to_complete[most:]
            writes = [w for w, _ in taken]
            try:
                results = await leasing.complete_many(writes)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: %d completions in one transaction failed (%s); writing each alone",
                            self.name, len(writes), exc)
                results = []
                for w in writes:
                    try:
                        results.append(await leasing.complete(None, *w))
                    except (ConnectionLost, DatabaseError) as one:
                        results.append(one)  # type: ignore[arg-type]
            for (_, done), result in zip(taken, results):
                if done.done():
                    continue
                if isinstance(result, BaseException):
                    done.set_exception(result)
                else:
                    done.set_result(bool(result))

    async def _heartbeat_loop(self, interval: float) -> None:
        """Renew every claimed lease in flight, in one statement per beat; cancel the runs whose lease
        is no longer ours."""
        while True:
            await asyncio.sleep(interval)
            leases = [(job_id, owner, seconds) for job_id, (owner, seconds, _) in self._held.items()]
            if not leases:
                continue
            try:
                kept = await self.leasing.heartbeat(leases)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: heartbeat failed (%s); retrying", self.name, exc)
                continue
            for job_id, _, _ in leases:
                held = self._held.get(job_id)
                if job_id not in kept and held is not None:
                    self._lost.add(job_id)
                    held[2].cancel()

    async def _rescue_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rescue_interval)
            try:
                for job_id, state in await self.leasing.rescue_expired():
                    log.warning("job %s: lease expired; %s", job_id, "queued again" if state == "queued" else "failed")
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: rescue failed (%s)", self.name, exc)

    async def _watch_loop(self, interval: float = 0.5) -> None:
        """Transaction-lease jobs in flight whose cancellation was requested: their handlers' tasks are
        cancelled (a handler awaiting something else would not notice its lease's session ending)."""
        while True:
            await asyncio.sleep(interval)
            if not self._txn_held:
                continue
            try:
                asked = await self.leasing.cancel_requested(list(self._txn_held))
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: cancellation check failed (%s)", self.name, exc)
                continue
            for job_id in asked:
                run = self._txn_held.get(job_id)
                if run is not None and job_id not in self._cancel_asked:
                    self._cancel_asked.add(job_id)
                    run.cancel()

    # ---- transaction lease ---------------------------------------------------------------------

    async def _txn_loop(self, names: list[str], stop_when_empty: bool) -> None:
        while not self._stopping.is_set():
            finished_before = self._finished
            async with self._slots:
                try:
                    ran = await self._run_one_txn(names)
                except (ConnectionLost, DatabaseError) as exc:
                    log.warning("asyncio worker %s: a transaction-lease job's session failed (%s)", self.name, exc)
                    ran = True
            if not ran:
                if stop_when_empty and self._empty(finished_before):
                    return
                await self._idle()

    async def _run_one_txn(self, names: list[str]) -> bool:
        """Claim one job in a lease transaction on a pooled connection, run it there and commit."""
        leasing = self.leasing
        async with leasing.lease() as conn:
            try:
                batch = await leasing.claim(conn, self.queues, names, 1)
                if not batch:
                    await leasing.rollback(conn)
                    return False
                me = asyncio.current_task()
                assert me is not None
                self._running.add(me)
                try:
                    self.stats.count(await self._run_txn(conn, batch[0]))
                finally:
                    self._running.discard(me)
                    self._finished += 1
            finally:
                if leasing.alive(conn) and leasing.usable(conn):
                    await leasing.rollback(conn)
        return True

    async def _run_txn(self, conn: Any, claimed: ClaimedJob) -> Outcome:
        leasing, name = self.leasing, self.name
        started_at = claimed.claimed_at
        task = self.app.tasks[claimed.task]
        attempt, cancel_reason, unrecorded, suspect = await leasing.start_attempt(claimed, name,
                                                                                  leasing.session_id(conn))
        if cancel_reason is not None:
            return await self._write(conn, claimed, attempt - 1, Cancelled(cancel_reason), False)
        if attempt > claimed.max_attempts:
            error = unrecorded or (
                f"gave up: {attempt - 1} attempt(s) started and none finished; the worker process died or lost its "
                "database connection during each (does the handler crash its worker?)")
            return await self._write(conn, claimed, attempt - 1, Failed(error), False)
        if task.timeout is not None:
            await leasing.set_local_timeouts(conn, task.timeout)
        await leasing.savepoint(conn)
        me = asyncio.current_task()
        assert me is not None
        self._txn_held[claimed.id] = me
        job = make_async_job(claimed, attempt, name, conn)
        try:
            if suspect:
                # Its last attempt never finished: this one runs alone in the process, charged if it never
                # finishes either (one poison job, one victim).
                log.info("job %s: its previous run never finished; attempt %s runs alone in this process",
                         claimed.id, attempt)
                async with self.gate.exclusive():
                    await leasing.mark_exclusive(claimed.id, attempt)
                    outcome = await run_handler(self.app, task, job, claimed, attempt)
            else:
                async with self.gate.shared():
                    outcome = await run_handler(self.app, task, job, claimed, attempt)
        except asyncio.CancelledError:
            if claimed.id not in self._cancel_asked:
                raise
            outcome = Cancelled("cancellation requested")
        finally:
            self._txn_held.pop(claimed.id, None)
            self._cancel_asked.discard(claimed.id)
        if isinstance(outcome, Done) and not leasing.in_transaction(conn):
            error = RuntimeError("the handler ended the job's transaction (commit/rollback on job.conn); the lease "
                                 "was lost. Handlers must leave job.conn's transaction open.")
            outcome = decide_failure(task, attempt, claimed.max_attempts, format_error(error), error)
        if isinstance(outcome, Done):
            try:
                await leasing.release_savepoint(conn)  # `done` in the top transaction (see `savepoint`)
                if await leasing.complete(conn, claimed, attempt, outcome.result, started_at, name):
                    await leasing.commit(conn)  # the handler's writes and `done`, together
                    return outcome
                outcome = Cancelled(CANCELLED_WHILE_RUNNING)  # the guard refused `done`
                await leasing.rollback(conn)  # its writes go with it
            except ConnectionLost:
                if not leasing.alive(conn):
                    error = "the connection was lost before the job's completion committed; its writes were lost with it"
                    outcome = decide_failure(task, attempt, claimed.max_attempts, error, None)
            except DatabaseError as refused:  # a deferred constraint at COMMIT, say: this attempt's failure
                outcome = decide_failure(task, attempt, claimed.max_attempts, format_error(refused), refused)
            return await self._write(conn, claimed, attempt, outcome, False)
        return await self._write(conn, claimed, attempt, outcome, True)

    async def _write(self, conn: Any, claimed: ClaimedJob, attempt: int, outcome: Outcome, undo: bool) -> Outcome:
        """An outcome that is not Done, in the lease transaction (after rolling back to the handler's
        savepoint) and committed; from a fresh transaction if the lease is gone or broken."""
        leasing = self.leasing
        state, delay, error, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1
        args = dict(state=state, delay=delay, error=error, started_at=claimed.claimed_at, worker=self.name,
                    uncount=uncount)
        if leasing.usable(conn):
            try:
                if undo:
                    await leasing.rollback_to_savepoint(conn)
                    await leasing.release_savepoint(conn)
                written = await leasing.record_outcome(conn, claimed, attempt, **args)
                await leasing.commit(conn)
                return _as_written(outcome, written)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("job %s: could not record its outcome in its transaction (%s); recording separately",
                            claimed.id, exc)
        if leasing.alive(conn):
            try:
                await leasing.rollback(conn)
            except (ConnectionLost, DatabaseError):
                pass
        written = await leasing.record_outcome(None, claimed, attempt, **args)
        return _as_written(outcome, written)

    def _empty(self, finished_before: int) -> bool:
        """Nothing in flight, and no job finished since the claim that found nothing began (its retry
        or snooze may have committed after that claim's snapshot)."""
        return not self._running and self._finished == finished_before

    def _track(self, run: "asyncio.Task[Any]") -> None:
        self._running.add(run)
        run.add_done_callback(self._running.discard)

