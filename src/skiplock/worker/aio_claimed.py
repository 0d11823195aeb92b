"""The asyncio worker's claimed-lease runs (worker/aio_worker.py): claimed in batches, holding no connection.

Guarantees (docs/guarantees.md, the asyncio worker rows):

- One claimer locks up to the free slots' worth of jobs in a short transaction, marks each
  ``running`` with its own owner token and a lease (``start_claimed``, pipelined) and commits: the
  attempt is durable before its handler starts, and the connection goes back to the pool. An
  in-flight job holds **no connection** (``job.conn`` is None).
- One heartbeat task renews every lease in flight in one statement per beat (a third of the
  shortest lease). A lease the heartbeat finds lost (rescued after a pause, or cancelled with
  ``cancel_job``) cancels its handler's task.
- Every finishing write is fenced on state ``running`` and the run's owner: a late writer (its lease
  rescued meanwhile) is refused and counted ``LeaseLost``. ``done`` writes are gathered, many per
  round trip and transaction (``complete_many``), each fenced on its own row; if that transaction
  fails each is written alone.
- A killed process's jobs stop being renewed and come back at rescue: every asyncio worker with
  claimed-lease tasks runs the rescuer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from ..backend.base import ClaimedJob
from ..errors import ConnectionLost, DatabaseError
from ..job import Cancelled, Done, Failed, LeaseLost, Outcome
from .aio_handler import make_async_job, run_handler
from .completer import Completer, _as_written, _row_for

if TYPE_CHECKING:
    from ..app import Task
    from .aio_worker import AsyncWorker

log = logging.getLogger("skiplock.worker")


class ClaimedLeaseRuns:
    """The claimed-lease side of one :class:`~skiplock.worker.aio_worker.AsyncWorker` (``w``): its
    loops (``claim_loop``, ``complete_loop``, ``heartbeat_loop``, ``rescue_loop``) run as tasks of the
    worker's ``run``; the slots, the pool and the counters are the worker's."""

    def __init__(self, worker: "AsyncWorker"):
        self.w = worker
        self._held: dict[int, tuple[uuid.UUID, float, asyncio.Task[Any]]] = {}  # claimed leases in flight
        self._lost: set[int] = set()
        self._to_complete: list[tuple[Any, asyncio.Future[bool]]] = []  # `done` writes waiting
        self._complete_wake = asyncio.Event()

    async def claim_loop(self, names: list[str], stop_when_empty: bool) -> None:
        leasing, tasks, slots = self.w.leasing, self.w.app.tasks, self.w._slots
        backoff = self.w.retry_backoff()
        while not self.w._stopping.is_set():
            await slots.acquire()  # at least one slot is free
            free = 1
            if self.w.concurrency >= 20 and self.w.concurrency - len(self.w._running) < self.w.concurrency // 10:
                await asyncio.sleep(0.005)  # jobs are finishing: claim for several slots at once
            while not slots.locked() and free < 1000:
                await slots.acquire()
                free += 1
            finished_before = self.w._finished
            delay = None
            try:
                started = await self._claim_started(names, free)
            except (ConnectionLost, DatabaseError) as exc:
                delay = self.w._failed(backoff, "claim failed", exc)
                started = []
            else:
                backoff.reset()
            for _ in range(free - len(started)):
                slots.release()
            for claimed, owner, begun in started:
                task = tasks[claimed.task]
                run = asyncio.ensure_future(self._run_claimed(claimed, task, owner, begun))
                self.w._track(run)
            if not started:
                if stop_when_empty and self.w._empty(finished_before):
                    return
                if delay is not None:
                    await self.w._pause(delay)
                else:
                    await self.w._idle()

    async def _claim_started(self, names: list[str], limit: int) -> list[tuple[ClaimedJob, uuid.UUID, Any]]:
        """Claim and start up to ``limit`` jobs in one short transaction, committed."""
        leasing, tasks = self.w.leasing, self.w.app.tasks
        async with leasing.lease() as conn:
            try:
                batch = await self.w.claim(conn, names, limit)
                if not batch:
                    await leasing.rollback(conn)
                    return []
                plan = [(c, uuid.uuid4(), tasks[c.task].lease_seconds) for c in batch]
                begun = await leasing.start_claimed_many(conn, plan, self.w.name)
                await leasing.commit(conn)
            except BaseException:
                if leasing.alive(conn):
                    await leasing.rollback(conn)
                raise
        return [(c, owner, b) for (c, owner, _), b in zip(plan, begun)]

    async def _run_claimed(self, claimed: ClaimedJob, task: "Task", owner: uuid.UUID, begun: Any) -> None:
        try:
            if begun is None:  # not queued any more (cannot happen while we held its lock)
                self.w.stats.count(LeaseLost(Failed("not queued when claimed")))
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
                    job = make_async_job(claimed, attempt, self.w.name, None)
                    async with self.w.gate.shared():
                        outcome = await run_handler(self.w.app, task, job, claimed, attempt)
                except asyncio.CancelledError:
                    if claimed.id in self._lost:  # the heartbeat found the lease no longer ours
                        self.w.stats.count(LeaseLost(Failed("lease lost")))
                        log.warning("job %s: lost its lease (rescued or cancelled meanwhile); its run was stopped",
                                    claimed.id)
                        return
                    raise
                finally:
                    self._held.pop(claimed.id, None)
                    self._lost.discard(claimed.id)
            self.w.stats.count(await self._finish_fenced(claimed, attempt, outcome, owner))
        except (ConnectionLost, DatabaseError) as exc:
            log.warning("job %s: its outcome could not be written (%s); its lease expires and the rescuer "
                        "returns it", claimed.id, exc)
        finally:
            self.w._finished += 1
            self.w._slots.release()
            if len(self.w._running) <= 1:
                self.w._last_done.set()

    async def _finish_fenced(self, claimed: ClaimedJob, attempt: int, outcome: Outcome, owner: uuid.UUID) -> Outcome:
        """The claimed lease's finishing write, fenced on state ``running`` and our owner, from a pooled
        connection; a refused write is a lost lease (rescued or cancelled meanwhile)."""
        leasing = self.w.leasing
        started_at = claimed.claimed_at
        if isinstance(outcome, Done):
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._to_complete.append(((claimed, attempt, outcome.result, started_at, self.w.name, owner), done))
            self._complete_wake.set()
            if await done:
                return outcome
            return Completer.lost(claimed, outcome)
        state, delay, error, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1
        written = await leasing.record_outcome(None, claimed, attempt, state=state, delay=delay, error=error,
                                               started_at=started_at, worker=self.w.name, owner=owner)
        if written is None:
            return Completer.lost(claimed, outcome)
        return _as_written(outcome, written)

    async def complete_loop(self, most: int = 500) -> None:
        """Claimed-lease ``done`` writes, many per round trip and transaction (``complete_many``), each
        fenced on its own row; if that transaction fails, each is written alone (fenced the same way)."""
        leasing = self.w.leasing
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
                            self.w.name, len(writes), exc)
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

    async def heartbeat_loop(self, interval: float) -> None:
        """Renew every claimed lease in flight, in one statement per beat; cancel the runs whose lease
        is no longer ours."""
        while True:
            await asyncio.sleep(interval)
            leases = [(job_id, owner, seconds) for job_id, (owner, seconds, _) in self._held.items()]
            if not leases:
                continue
            try:
                kept = await self.w.leasing.heartbeat(leases)
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: heartbeat failed (%s); retrying", self.w.name, exc)
                continue
            for job_id, _, _ in leases:
                held = self._held.get(job_id)
                if job_id not in kept and held is not None:
                    self._lost.add(job_id)
                    held[2].cancel()

    async def rescue_loop(self) -> None:
        while True:
            await asyncio.sleep(self.w.rescue_interval)
            try:
                for job_id, state in await self.w.leasing.rescue_expired():
                    log.warning("job %s: lease expired; %s", job_id, "queued again" if state == "queued" else "failed")
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: rescue failed (%s)", self.w.name, exc)
