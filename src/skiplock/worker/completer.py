"""The completer: turns a job's outcome (a value, decided by the executor) into its durable write.

Which write, in one place:
- ``write``: in the lease transaction while it is usable -- ``done`` (guarded: a cancellation
  requested meanwhile refuses it, and the job is recorded cancelled), or the outcome's row (after
  rolling back to the handler's savepoint if it touched the database); if the lease is gone, the
  same outcome from a fresh transaction that never waits on a row lock (``record_outcome`` in
  queries.sql: a row still locked keeps the error pending in job_attempts, recorded once by the
  job's next finishing write);
- ``commit``: the lease's COMMIT; one refused on a live session (a deferred constraint) is that
  attempt's failure, retried like any other, never a lost connection;
- ``finish_claimed``: the claimed lease's fenced finish (state ``running`` and our owner token),
  on the slot's connection or, when its session is gone, from a fresh one -- so the job converges;
- batched ``done`` writes go with the batch's COMMIT (``complete_batch``, run by the executor).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from ..backend.base import ClaimedJob
from ..backend.postgres.backend import CONNECTION_LOST, connection_lost, session_gone
from ..errors import storable_text
from ..job import Cancelled, Done, Failed, LeaseLost, Outcome, RetryLater, Snoozed
from .failures import decide_failure, format_error

if TYPE_CHECKING:
    from ..app import Task
    from ..backend.postgres import PostgresBackend

log = logging.getLogger("skiplock.worker")


def usable(conn: psycopg.Connection[Any]) -> bool:
    return not conn.closed and conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class Completer:
    """Writes outcomes for one worker; shared by its slots (it holds no per-job state)."""

    def __init__(self, backend: "PostgresBackend"):
        self.backend = backend

    def release(self, conn: psycopg.Connection[Any]) -> None:
        """Release the savepoint of a job whose outcome is written (see ``release_savepoint`` in
        queries.sql), if the lease is still usable -- a gone one is handled by whoever comes next."""
        if usable(conn) and conn.info.transaction_status == TransactionStatus.INTRANS:
            self.backend.release_savepoint(conn)

    def commit(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, task: "Task", attempt: int,
                outcome: Outcome, started_at: datetime, slot: str) -> Outcome:
        """COMMIT the lease. If the server refuses it on a live session (a deferred constraint the
        handler's writes broke, say), the transaction -- the job's ``done`` and the handler's writes --
        is rolled back, and that error is this attempt's failure, recorded from a fresh transaction
        and retried like any other (never taken for a lost connection)."""
        try:
            conn.commit()
            return outcome
        except psycopg.Error as exc:
            if connection_lost(exc) or not isinstance(outcome, Done):
                raise
            refused: psycopg.Error = exc
        log.warning("job %s (%s) attempt %s/%s: its COMMIT was refused: %s: %s", claimed.id, claimed.task, attempt,
                    claimed.max_attempts, type(refused).__qualname__, refused)
        failure = decide_failure(task, attempt, claimed.max_attempts, format_error(refused), refused)
        return self.write(conn, claimed, attempt, failure, started_at, slot, False)

    @staticmethod
    def still_leased(conn: psycopg.Connection[Any], task: "Task", attempt: int, claimed: ClaimedJob,
                      outcome: Outcome) -> Outcome:
        """A handler that ended the job's transaction (commit/rollback on job.conn) lost its lease: a
        returned handler is then a failure, not done."""
        if isinstance(outcome, Done) and (conn.closed or conn.info.transaction_status != TransactionStatus.INTRANS):
            error = RuntimeError("the handler ended the job's transaction (commit/rollback on job.conn); the lease "
                                 "was lost. Handlers must leave job.conn's transaction open.")
            return decide_failure(task, attempt, claimed.max_attempts, format_error(error), error)
        return outcome

    def finish_claimed(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, attempt: int, outcome: Outcome,
                        started_at: datetime, slot: str, owner: uuid.UUID, task: "Task") -> Outcome:
        """The fenced finishing write (state ``running`` and our owner), on the slot's connection while
        its session lives. The server may have ended that session while the handler ran (it sat idle:
        ``idle_session_timeout``, a terminate, a restart); then the write still happens, on a fresh
        connection and fenced the same way, so the job always converges:

        - ``Done`` and the handler left nothing uncommitted on ``job.conn`` (no transaction open):
          completed from the fresh connection; it ran once and is done once.
        - ``Done`` but the handler had written through ``job.conn``: those writes died with the
          session, so the job is not done. The attempt is a failure like any other, counted: retried
          by the task's policy, or ``failed`` after ``max_attempts``.
        - any other outcome: written as decided.
        """
        backend = self.backend
        gone = conn.closed or conn.broken
        handler_wrote = gone or conn.info.transaction_status != TransactionStatus.IDLE
        if isinstance(outcome, Done):
            lost: BaseException | None = None
            refused: psycopg.Error | None = None
            if not gone:
                try:
                    if backend.complete(conn, claimed, attempt, outcome.result, started_at, slot, owner):
                        conn.commit()
                        return outcome
                    conn.rollback()  # refused: the handler's writes go with it
                    return self.lost(claimed, outcome)
                except psycopg.Error as exc:
                    if connection_lost(exc):
                        lost = exc
                    else:  # the server refused the write or its COMMIT (a deferred constraint, say)
                        refused = exc
            if refused is not None:
                log.warning("job %s (%s) attempt %s/%s: its completion was refused: %s: %s", claimed.id,
                            claimed.task, attempt, claimed.max_attempts, type(refused).__qualname__, refused)
                outcome = decide_failure(task, attempt, claimed.max_attempts, format_error(refused), refused)
            elif not handler_wrote:
                if backend.complete(None, claimed, attempt, outcome.result, started_at, slot, owner):
                    return outcome
                return self.lost(claimed, outcome)
            else:
                error = ("the connection was lost before the job's completion committed; the handler's writes "
                         f"through job.conn were lost with it ({lost if lost is not None else 'the session was gone'})")
                outcome = decide_failure(task, attempt, claimed.max_attempts, error, lost)
        state, delay, error_text, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1
        written: str | None = None
        done = False
        if not (conn.closed or conn.broken):
            try:
                conn.rollback()
                written = backend.record_outcome(conn, claimed, attempt, state=state, delay=delay, error=error_text,
                                                 started_at=started_at, worker=slot, uncount=False, owner=owner)
                conn.commit()
                done = True
            except CONNECTION_LOST as exc:
                if not session_gone(exc):
                    raise
        if not done:  # the session is gone: the same fenced write from a fresh connection
            written = backend.record_outcome(None, claimed, attempt, state=state, delay=delay, error=error_text,
                                             started_at=started_at, worker=slot, uncount=False, owner=owner)
        if written is None:
            return self.lost(claimed, outcome)
        return _as_written(outcome, written)

    @staticmethod
    def lost(claimed: ClaimedJob, outcome: Outcome) -> Outcome:
        log.warning("job %s: lost its lease (rescued or cancelled meanwhile); our finishing write was refused",
                    claimed.id)
        return LeaseLost(outcome)

    def write(self, conn: psycopg.Connection[Any], claimed: ClaimedJob, attempt: int, outcome: Outcome,
               started_at: datetime, slot: str, ran: bool) -> Outcome:
        backend = self.backend
        if isinstance(outcome, Done):
            # A failure here (connection lost before or during COMMIT) propagates: the server either
            # committed (the guard makes any later failure record a no-op) or rolled back (queued).
            if backend.complete(conn, claimed, attempt, outcome.result, started_at, slot):
                return outcome
            outcome = Cancelled("cancellation requested while the job ran")  # the guard refused 'done'
        state, delay, error, uncount = _row_for(outcome)
        if uncount:
            attempt -= 1  # a snooze gives its attempt back
        if usable(conn):
            try:
                if ran:
                    backend.rollback_to_savepoint(conn)
                written = backend.record_outcome(conn, claimed, attempt, state=state, delay=delay, error=error,
                                                 started_at=started_at, worker=slot, uncount=uncount)
                return _as_written(outcome, written)
            except psycopg.Error as db_exc:  # recorded from a fresh transaction below
                if not connection_lost(db_exc):
                    log.warning("job %s: could not record its outcome in its transaction (%s); recording "
                                "separately", claimed.id, db_exc)
        broken = conn.broken
        if not conn.closed:
            try:
                conn.rollback()
            except psycopg.Error:
                broken = True
        written = backend.record_outcome(None, claimed, attempt, state=state, delay=delay, error=error,
                                         started_at=started_at, worker=slot, uncount=uncount)
        if written is None:
            log.warning("job %s: attempt %s's outcome was not written: the job is no longer queued, or its row is "
                        "still locked (its session has not exited yet, or another worker claimed it); then its "
                        "error is kept in job_attempts and recorded by the job's next finishing write",
                        claimed.id, attempt)
        if broken:
            raise psycopg.OperationalError("the job's connection was lost during the attempt")
        return _as_written(outcome, written)


def _row_for(outcome: Outcome) -> tuple[str, float | None, str | None, bool]:
    """(state, delay, error, give the attempt back) to write for an outcome that is not Done."""
    if isinstance(outcome, RetryLater):
        return "queued", outcome.delay, storable_text(outcome.error), False
    if isinstance(outcome, Snoozed):
        return "queued", outcome.delay, None, True
    if isinstance(outcome, Cancelled):
        return "cancelled", None, storable_text(f"cancelled: {outcome.reason}"), False
    assert isinstance(outcome, Failed)
    return "failed", None, storable_text(outcome.error), False


def _as_written(outcome: Outcome, written: str | None) -> Outcome:
    """A pending cancellation request overrides the decided outcome in the database; report that."""
    if written == "cancelled" and not isinstance(outcome, Cancelled):
        return Cancelled("cancellation requested")
    return outcome
