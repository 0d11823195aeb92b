"""The completer: turns a job's outcome (a value, decided by the executor) into its durable write,
made by one backend verb, ``Backend.finish`` (which chooses the SQL); the completer decides which
write (``base.Finish``: ``Via.LEASE``, ``Via.FRESH``, ``Via.BATCH_COMMIT``; ``owner`` fences a
claimed lease's) and reads the lease's state through ``Lease`` (never a driver connection):

- ``write``: in the lease transaction while it is usable, by its top transaction (the handler's
  savepoint, if it touched the database, released first: see ``savepoint`` in queries.sql) --
  ``done`` (guarded: a cancellation requested meanwhile refuses it, and the job is recorded
  cancelled; if the handler had written, the lease's transaction is rolled back whole, as the
  canceller's ending of the session would have: its batch-mates run again), or the outcome's row
  (after rolling back to the handler's savepoint if it touched the database); if the lease is gone, the
  same outcome from a fresh transaction that never waits on a row lock (``record_outcome`` in
  queries.sql: a row still locked keeps the error pending in job_attempts, recorded once by the
  job's next finishing write);
- ``commit``: the lease's COMMIT; one refused on a live session (a deferred constraint:
  ``DatabaseError``) is that attempt's failure, retried like any other, never a lost connection;
- ``finish_claimed``: the claimed lease's fenced finish (state ``running`` and our owner token),
  on the slot's lease or, when its session is gone, from a fresh connection -- so the job converges;
- ``finish_batch``: a batch's ``done`` writes, deferred and sent with its COMMIT (one round trip); a
  job refused there (a cancellation requested while it ran, with no database effects) is recorded
  cancelled afterwards.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Sequence

from ..backend.base import ClaimedJob, Finish, Via, Write
from ..errors import ConnectionLost, DatabaseError, SkiplockError, storable_text
from ..job import Cancelled, Done, Failed, LeaseLost, Outcome, RetryLater, Snoozed
from .failures import decide_failure, format_error

if TYPE_CHECKING:
    from ..app import Task
    from ..backend.base import Backend, Lease

log = logging.getLogger("skiplock.worker")

CANCELLED_WHILE_RUNNING = "cancellation requested while the job ran"
# How long a slot whose session was ended looks for a cancel that ended it (cancel_job polls the row
# every 20 ms once it asked the session to end); a genuine outage answers at once (the read fails).
CANCEL_SETTLE = 1.0


class CancelledWhileRunning(ConnectionLost):
    """The job's session was ended by a cancel request (``cancel_job``) and the job is recorded
    cancelled: its slot starts a new session, and says so as a cancel, not as a lost database."""

    def __init__(self, claimed: ClaimedJob, outcome: Outcome):
        super().__init__(f"job {claimed.id} was cancelled while it ran (its session was ended)")
        self.claimed, self.outcome = claimed, outcome


def usable(lease: "Lease") -> bool:
    """A transaction is open on the lease (possibly in error: a rollback to the savepoint fixes it)."""
    return lease.in_transaction() or lease.in_error()


class Completer:
    """Writes outcomes for one worker; shared by its slots (it holds no per-job state)."""

    def __init__(self, backend: "Backend"):
        self.backend = backend

    def commit(self, lease: "Lease", claimed: ClaimedJob, task: "Task", attempt: int,
               outcome: Outcome, started_at: datetime, slot: str) -> Outcome:
        """COMMIT the lease. If the server refuses it on a live session (a deferred constraint the
        handler's writes broke, say), the transaction -- the job's ``done`` and the handler's writes --
        is rolled back, and that error is this attempt's failure, recorded from a fresh transaction
        and retried like any other (never taken for a lost connection: ``ConnectionLost`` propagates)."""
        try:
            lease.commit()
            return outcome
        except DatabaseError as exc:
            if not isinstance(outcome, Done):
                raise
            refused = exc
        log.warning("job %s (%s) attempt %s/%s: its COMMIT was refused: %s", claimed.id, claimed.task, attempt,
                    claimed.max_attempts, refused)
        failure = decide_failure(task, attempt, claimed.max_attempts, format_error(refused), refused)
        return self.write(lease, claimed, attempt, failure, started_at, slot, False)

    @staticmethod
    def still_leased(lease: "Lease", task: "Task", attempt: int, claimed: ClaimedJob, outcome: Outcome) -> Outcome:
        """A handler that ended the job's transaction (commit/rollback on job.conn) lost its lease: a
        returned handler is then a failure, not done."""
        if isinstance(outcome, Done) and not lease.in_transaction():
            error = RuntimeError("the handler ended the job's transaction (commit/rollback on job.conn); the lease "
                                 "was lost. Handlers must leave job.conn's transaction open.")
            return decide_failure(task, attempt, claimed.max_attempts, format_error(error), error)
        return outcome

    def finish_claimed(self, lease: "Lease", claimed: ClaimedJob, attempt: int, outcome: Outcome,
                       started_at: datetime, slot: str, owner: uuid.UUID, task: "Task") -> Outcome:
        """The fenced finishing write (state ``running`` and our owner), on the slot's lease while
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
        finish = self.backend.finish
        gone = not lease.alive()
        handler_wrote = gone or not lease.idle()
        if isinstance(outcome, Done):
            done = Write(claimed, attempt, "done", started_at, slot, result=outcome.result, owner=owner)
            lost: BaseException | None = None
            refused: DatabaseError | None = None
            if not gone:
                try:
                    if finish(lease, Finish(Via.LEASE, (done,))):
                        lease.commit()
                        return outcome
                    lease.rollback()  # refused: the handler's writes go with it
                    return self.lost(claimed, outcome)
                except ConnectionLost as exc:
                    lost = exc
                except DatabaseError as exc:  # the server refused the write or its COMMIT (a deferred constraint)
                    refused = exc
            if refused is not None:
                log.warning("job %s (%s) attempt %s/%s: its completion was refused: %s", claimed.id,
                            claimed.task, attempt, claimed.max_attempts, refused)
                outcome = decide_failure(task, attempt, claimed.max_attempts, format_error(refused), refused)
            elif not handler_wrote:
                if finish(None, Finish(Via.FRESH, (done,))):
                    return outcome
                return self.lost(claimed, outcome)
            else:
                error = ("the connection was lost before the job's completion committed; the handler's writes "
                         f"through job.conn were lost with it ({lost if lost is not None else 'the session was gone'})")
                outcome = decide_failure(task, attempt, claimed.max_attempts, error, lost)
        write = _write_for(outcome, claimed, attempt, started_at, slot, owner=owner)
        written: str | None = None
        recorded = False
        if lease.alive():
            try:
                lease.rollback()
                written = finish(lease, Finish(Via.LEASE, (write,))).get(claimed.id)
                lease.commit()
                recorded = True
            except ConnectionLost:
                pass
        if not recorded:  # the session is gone: the same fenced write from a fresh connection
            written = finish(None, Finish(Via.FRESH, (write,))).get(claimed.id)
        if written is None:
            return self.lost(claimed, outcome)
        return _as_written(outcome, written)

    @staticmethod
    def lost(claimed: ClaimedJob, outcome: Outcome) -> Outcome:
        log.warning("job %s: lost its lease (rescued or cancelled meanwhile); our finishing write was refused",
                    claimed.id)
        return LeaseLost(outcome)

    def write(self, lease: "Lease", claimed: ClaimedJob, attempt: int, outcome: Outcome,
              started_at: datetime, slot: str, ran: bool) -> Outcome:
        """An outcome written in the lease transaction (not committed), else from a fresh one.
        ``ran``: the handler touched the database: its savepoint is released (``done``) or rolled
        back and released (any other outcome) first, so no savepoint of it is left either way.
        Raises ``CancelledWhileRunning`` (the lease closed) when a cancellation refused the ``done``
        of a handler that had written."""
        finish = self.backend.finish
        if isinstance(outcome, Done):
            # A failure here (connection lost before or during COMMIT) propagates: the server either
            # committed (the guard makes any later failure record a no-op) or rolled back (queued).
            if finish(lease, Finish(Via.LEASE, (Write(claimed, attempt, "done", started_at, slot,
                                                      result=outcome.result, release=ran),))):
                return outcome
            outcome = Cancelled(CANCELLED_WHILE_RUNNING)  # the guard refused 'done'
            if ran:  # its writes joined the lease's transaction: only ending that undoes them
                self._end_lease(lease)
                write = _write_for(outcome, claimed, attempt, started_at, slot)
                written = finish(None, Finish(Via.FRESH, (write,))).get(claimed.id)
                raise CancelledWhileRunning(claimed, _as_written(outcome, written))
        write = _write_for(outcome, claimed, attempt, started_at, slot, undo=ran)
        if usable(lease):
            try:
                return _as_written(outcome, finish(lease, Finish(Via.LEASE, (write,))).get(claimed.id))
            except (ConnectionLost, DatabaseError) as db_exc:  # recorded from a fresh transaction below
                if not isinstance(db_exc, ConnectionLost):
                    log.warning("job %s: could not record its outcome in its transaction (%s); recording "
                                "separately", claimed.id, db_exc)
        broken = lease.lost()
        if lease.alive():
            try:
                lease.rollback()
            except (ConnectionLost, DatabaseError):
                broken = True
        written = finish(None, Finish(Via.FRESH, (write,))).get(claimed.id)
        if broken and (written == "cancelled" or (written is None and self._cancelled_meanwhile(claimed.id))):
            # a cancel request ended the session: a cancel, not an outage (recorded by our write, or by
            # cancel_job itself once the dying session released the row)
            raise CancelledWhileRunning(claimed, _as_written(outcome, "cancelled"))
        if written is None:
            log.warning("job %s: attempt %s's outcome was not written: the job is no longer queued, or its row is "
                        "still locked (its session has not exited yet, or another worker claimed it); then its "
                        "error is kept in job_attempts and recorded by the job's next finishing write",
                        claimed.id, attempt)
        if broken:
            raise ConnectionLost("the job's connection was lost during the attempt")
        return _as_written(outcome, written)

    @staticmethod
    def _end_lease(lease: "Lease") -> None:
        """Roll the lease's transaction back (its row locks go: a fresh write can record the job) and
        close it: the slot starts a new session (``CancelledWhileRunning``), and a batch runs no
        further job on a transaction that no longer holds its jobs."""
        try:
            lease.rollback()
        except (ConnectionLost, DatabaseError):
            pass
        lease.close()

    def _cancelled_meanwhile(self, job_id: int) -> bool:
        """After a lost session whose outcome could not be written: did a cancel end it? ``cancel_job``
        records its request, ends the job's session and cancels the row once the dying session has
        released it -- which may be just after our write skipped the still-locked row. So look for a
        while (:data:`CANCEL_SETTLE`) until the job is no longer in flight. Never raises: a database
        that is gone answers False (the slot reconnects and says so)."""
        deadline = time.monotonic() + CANCEL_SETTLE
        while True:
            try:
                row = self.backend.get_job(job_id)
            except SkiplockError:
                return False
            state = None if row is None else row.get("state")
            if state == "cancelled":
                return True
            # 'running': the dying session still holds the row; 'queued': released, not cancelled (yet)
            if state not in ("running", "queued") or time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def finish_batch(self, lease: "Lease", batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                     started_at: datetime, slot: str) -> list[Outcome]:
        """End a batch's transaction: its deferred ``done`` writes with the COMMIT (``Via.BATCH_COMMIT``).
        A job refused there (a cancellation was requested while it ran; it had no database effects)
        is recorded cancelled afterwards."""
        writes = [Write(claimed, attempt, "done", started_at, slot, result=result) for claimed, attempt, result in done]
        written = self.backend.finish(lease, Finish(Via.BATCH_COMMIT, writes, batch))
        outcomes: list[Outcome] = []
        for claimed, attempt, result in done:
            if claimed.id in written:
                outcomes.append(Done(result))
            else:
                outcomes.append(self.write(lease, claimed, attempt, Cancelled(CANCELLED_WHILE_RUNNING),
                                           started_at, slot, False))
        return outcomes


def _write_for(outcome: Outcome, claimed: ClaimedJob, attempt: int, started_at: datetime, slot: str, *,
               undo: bool = False, owner: uuid.UUID | None = None) -> Write:
    """The write of an outcome that is not Done (a snooze gives its attempt back)."""
    state, delay, error, uncount = _row_for(outcome)
    if uncount:
        attempt -= 1
    return Write(claimed, attempt, state, started_at, slot, delay=delay, error=error,
                 uncount=uncount and owner is None, undo=undo, owner=owner)


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
