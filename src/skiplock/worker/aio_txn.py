"""The asyncio worker's transaction-lease runs (worker/aio_worker.py): one pooled connection per job, its transaction the lease.

Guarantees (docs/guarantees.md, the asyncio worker rows):

- Each running job holds one pooled connection whose transaction is the lease (``job.conn``, a
  psycopg ``AsyncConnection``), so ``max_connections - 2`` bounds how many run at once.
- The attempt is counted first in its own short transaction (``start_attempt``); the handler runs
  inside a SAVEPOINT taken before it starts. ``done`` is written in the same transaction after the
  savepoint is released and committed with the handler's writes -- or the savepoint is rolled back
  and the outcome written there, so nobody can claim the job between the rollback and the record of
  why. If the lease is gone or broken, the outcome is written from a fresh transaction.
- A killed process's sessions end and the server rolls their jobs back at once.
- One poison job, one victim: a suspect (its last attempt never finished) runs alone in its process
  (the worker's ``AsyncRunGate``), where a crash is its own and charged.
- ``cancel_job`` on a running job cancels its handler's task (``watch_loop``) and records it
  ``cancelled``; its ``job.conn`` writes roll back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..backend.base import ClaimedJob
from ..errors import ConnectionLost, DatabaseError
from ..job import Cancelled, Done, Failed, Outcome
from .aio_handler import make_async_job, run_handler
from .completer import CANCELLED_WHILE_RUNNING, _as_written, _row_for
from .failures import decide_failure, format_error

if TYPE_CHECKING:
    from .aio_worker import AsyncWorker

log = logging.getLogger("skiplock.worker")


class TransactionLeaseRuns:
    """The transaction-lease side of one :class:`~skiplock.worker.aio_worker.AsyncWorker` (``w``):
    ``run_loop`` tasks (one per connection the pool can spare) and ``watch_loop`` run as tasks of the
    worker's ``run``; the slots, the pool and the counters are the worker's."""

    def __init__(self, worker: "AsyncWorker"):
        self.w = worker
        self._txn_held: dict[int, asyncio.Task[Any]] = {}  # jobs in flight
        self._cancel_asked: set[int] = set()

    async def watch_loop(self, interval: float = 0.5) -> None:
        """Transaction-lease jobs in flight whose cancellation was requested: their handlers' tasks are
        cancelled (a handler awaiting something else would not notice its lease's session ending)."""
        while True:
            await asyncio.sleep(interval)
            if not self._txn_held:
                continue
            try:
                asked = await self.w.leasing.cancel_requested(list(self._txn_held))
            except (ConnectionLost, DatabaseError) as exc:
                log.warning("asyncio worker %s: cancellation check failed (%s)", self.w.name, exc)
                continue
            for job_id in asked:
                run = self._txn_held.get(job_id)
                if run is not None and job_id not in self._cancel_asked:
                    self._cancel_asked.add(job_id)
                    run.cancel()

    async def run_loop(self, names: list[str], stop_when_empty: bool) -> None:
        backoff = self.w.retry_backoff()
        while not self.w._stopping.is_set():
            finished_before = self.w._finished
            delay = None
            async with self.w._slots:
                try:
                    ran = await self._run_one_txn(names)
                except (ConnectionLost, DatabaseError) as exc:
                    delay = self.w._failed(backoff, "a transaction-lease claim or job's session failed", exc)
                    ran = True
                else:
                    backoff.reset()
            if delay is not None:  # not holding the slot
                await self.w._pause(delay)
            elif not ran:
                if stop_when_empty and self.w._empty(finished_before):
                    return
                await self.w._idle()

    async def _run_one_txn(self, names: list[str]) -> bool:
        """Claim one job in a lease transaction on a pooled connection, run it there and commit."""
        leasing = self.w.leasing
        async with leasing.lease() as conn:
            try:
                batch = await self.w.claim(conn, names, 1)
                if not batch:
                    await leasing.rollback(conn)
                    return False
                me = asyncio.current_task()
                assert me is not None
                self.w._running.add(me)
                try:
                    self.w.stats.count(await self._run_txn(conn, batch[0]))
                finally:
                    self.w._running.discard(me)
                    self.w._finished += 1
            finally:
                if leasing.alive(conn) and leasing.usable(conn):
                    await leasing.rollback(conn)
        return True

    async def _run_txn(self, conn: Any, claimed: ClaimedJob) -> Outcome:
        leasing, name = self.w.leasing, self.w.name
        started_at = claimed.claimed_at
        task = self.w.app.tasks[claimed.task]
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
                async with self.w.gate.exclusive():
                    await leasing.mark_exclusive(claimed.id, attempt)
                    outcome = await run_handler(self.w.app, task, job, claimed, attempt)
            else:
                async with self.w.gate.shared():
                    outcome = await run_handler(self.w.app, task, job, claimed, attempt)
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
        leasing = self.w.leasing
        state, delay, error, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1
        args = dict(state=state, delay=delay, error=error, started_at=claimed.claimed_at, worker=self.w.name,
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
