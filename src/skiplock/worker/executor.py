"""Runs one claimed job inside its lease transaction and writes the outcome.

Guarantees (transaction lease):
- The handler runs on the lease connection, after a SAVEPOINT. If it returns, the ``done`` update
  is written in the same transaction and committed: its database writes and the completion commit
  together, or neither does.
- If it raises, we roll back to the savepoint (its effects vanish, the row lock stays ours) and
  write the retry/failed outcome in the same transaction, so nobody can claim the job between the
  rollback and the record of why it failed.
- If the connection itself is gone (killed backend, timeout, network), the server has rolled the
  whole attempt back; the outcome is then written in a fresh transaction that never waits on a row
  lock (see ``record_failure`` in queries.sql).
- Every attempt is counted on a separate autocommit connection before the handler starts, so a
  handler that kills its worker process still uses up an attempt and ends ``failed``.
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from ..backend.base import ClaimedJob
from ..job import Done, Failed, Job, JobState, Outcome, RetryLater

if TYPE_CHECKING:
    from ..app import App, Task

log = logging.getLogger("skiplock.worker")

MAX_ERROR_CHARS = 16_000
MAX_RESULT_BYTES = 1 << 20


def format_error(exc: BaseException) -> str:
    """``Type: message`` then the traceback, bounded in size."""
    head = f"{type(exc).__qualname__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f"{head}\n\n{tb}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n... [truncated] ...\n" + text[-MAX_ERROR_CHARS // 2 :]
    return text


def decide_failure(task: "Task | None", attempt: int, max_attempts: int, error: str,
                   exc: BaseException | None) -> Outcome:
    """Pure: what a failed attempt leads to. Retries use the task's policy until max_attempts."""
    if task is None or attempt >= max_attempts:
        return Failed(error)
    delay = task.retry(attempt, exc)
    if delay is None:
        return Failed(error)
    return RetryLater(float(delay), error)


@dataclass
class RunResult:
    outcome: Outcome
    job_id: int


def _usable(conn: psycopg.Connection[Any]) -> bool:
    return not conn.closed and conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class Executor:
    """Executes claimed jobs for one worker; shared by its slots (it holds no per-job state)."""

    def __init__(self, app: "App", worker_name: str):
        self.app = app
        self.backend = app.backend
        self.worker_name = worker_name
        self._attempts_conn: psycopg.Connection[Any] | None = None
        self._attempts_lock = threading.Lock()

    def _start_attempt(self, claimed: ClaimedJob, slot: str) -> int:
        """Count the attempt on the worker's shared bookkeeping connection (reconnecting once)."""
        with self._attempts_lock:
            for retry in (False, True):
                if self._attempts_conn is None or self._attempts_conn.closed:
                    self._attempts_conn = self.backend.connect_bookkeeping()
                try:
                    return self.backend.start_attempt(self._attempts_conn, claimed, slot)
                except psycopg.OperationalError:
                    self._attempts_conn.close()
                    self._attempts_conn = None
                    if retry:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._attempts_lock:
            if self._attempts_conn is not None:
                self._attempts_conn.close()
                self._attempts_conn = None

    def run(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, slot: str) -> Outcome:
        backend = self.backend
        started_at = claimed.claimed_at  # the database's clock, like finished_at
        attempt = self._start_attempt(claimed, slot)
        if attempt > claimed.max_attempts:
            error = (
                f"gave up: {attempt - 1} attempt(s) started and none finished; the worker process died or lost its "
                "database connection during each (does the handler crash its worker?)"
            )
            return self._write(conn, claimed, attempt - 1, Failed(error), started_at, slot, None)
        task = self.app.tasks.get(claimed.task)
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            error = (f"unknown task {claimed.task!r}: no handler is registered under that name in this worker "
                     f"(registered: {known}). The job is kept as failed.")
            return self._write(conn, claimed, attempt, Failed(error), started_at, slot, None)

        backend.savepoint(conn)
        job = Job(id=claimed.id, queue=claimed.queue, task=claimed.task, args=claimed.args,
                  priority=claimed.priority, state=JobState.QUEUED, attempts=attempt,
                  max_attempts=claimed.max_attempts, run_at=claimed.run_at, created_at=claimed.created_at,
                  started_at=started_at, worker=slot, conn=conn)
        exc: BaseException | None = None
        try:
            result = task.fn(job, **claimed.args)
            outcome: Outcome = Done(self._result_json(result))
            if conn.closed or conn.info.transaction_status != TransactionStatus.INTRANS:
                raise RuntimeError("the handler ended the job's transaction (commit/rollback on job.conn); "
                                   "the lease was lost. Handlers must leave job.conn's transaction open.")
        except BaseException as caught:  # noqa: BLE001 - every failure must be recorded, even BaseException
            exc = caught
            error = format_error(caught)
            outcome = decide_failure(task, attempt, claimed.max_attempts, error, caught)
            log.warning("job %s (%s) attempt %s/%s failed: %s: %s", claimed.id, claimed.task, attempt,
                        claimed.max_attempts, type(caught).__qualname__, caught)
        # A BaseException (SystemExit, KeyboardInterrupt raised by the handler) is recorded like any
        # other failure and not re-raised: one bad handler must not take the slot down.
        return self._write(conn, claimed, attempt, outcome, started_at, slot, exc)

    @staticmethod
    def _result_json(result: Any) -> str | None:
        if result is None:
            return None
        try:
            text = json.dumps(result, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the handler's return value is not JSON-serialisable: {exc}") from None
        if len(text) > MAX_RESULT_BYTES:
            raise ValueError(f"the handler's return value is {len(text):,} bytes as JSON; the limit is {MAX_RESULT_BYTES:,}")
        return text

    def _write(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, attempt: int, outcome: Outcome,
               started_at: datetime, slot: str, exc: BaseException | None) -> Outcome:
        backend = self.backend
        if isinstance(outcome, Done):
            # A failure here (connection lost before or during COMMIT) propagates: the server either
            # committed (the guard makes any later failure record a no-op) or rolled back (queued).
            backend.complete(conn, claimed, attempt, outcome.result, started_at, slot)
            conn.commit()
            return outcome
        state, delay, error = ("queued", outcome.delay, outcome.error) if isinstance(outcome, RetryLater) \
            else ("failed", None, outcome.error)
        if _usable(conn):
            try:
                if exc is not None:
                    backend.rollback_to_savepoint(conn)
                backend.record_failure(conn, claimed, attempt, state=state, delay=delay, error=error,
                                       started_at=started_at, worker=slot)
                conn.commit()
                return outcome
            except psycopg.OperationalError:
                pass  # the connection died under us: record from a fresh one below
            except psycopg.Error as db_exc:
                log.warning("job %s: could not record failure in its transaction (%s); recording separately",
                            claimed.id, db_exc)
        broken = conn.closed or conn.broken
        if not broken:
            try:
                conn.rollback()
            except psycopg.Error:
                broken = True
        backend.record_failure(None, claimed, attempt, state=state, delay=delay, error=error,
                               started_at=started_at, worker=slot)
        if broken:
            raise psycopg.OperationalError("the job's connection was lost during the attempt")
        return outcome
