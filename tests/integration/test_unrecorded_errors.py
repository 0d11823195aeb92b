"""An attempt's error whose record was skipped (its row still locked) is kept in job_attempts and
recorded by the job's next finishing write that commits -- never by one that rolls back.

These drive the backend the way the executor does, with a second session holding the job's row lock
in place of a dead lease session that has not exited yet (tests/faults/test_fault_handlers.py does
the same with real worker processes and a SIGSTOPped backend)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone

import psycopg
import pytest

from skiplock.backend.base import ClaimedJob


def now() -> datetime:
    return datetime.now(timezone.utc)


def claim(app, conn, limit: int = 1) -> list[ClaimedJob]:
    return app.backend.claim(conn, ["default"], limit=limit)


def start_attempt(app, job: ClaimedJob) -> tuple[int, str | None, str | None]:
    book = app.backend.connect_bookkeeping()
    try:
        return app.backend.start_attempt(book, job, "w", None, exclusive=True)[:3]
    finally:
        book.close()


def attempt_whose_record_is_skipped(app, dsn, job_id: int, error: str) -> int:
    """One attempt of ``job_id``: counted, then its session 'dies' while still holding the row lock,
    so its fresh-transaction failure record is skipped. Returns the attempt number."""
    with psycopg.connect(dsn) as dying:
        (job,) = claim(app, dying)
        assert job.id == job_id
        attempt = start_attempt(app, job)[0]
        written = app.backend.record_outcome(None, job, attempt, state="queued", delay=0, error=error,
                                             started_at=job.claimed_at, worker="w")
        assert written is None  # the row is locked: skipped, without waiting
        dying.rollback()  # the session finally exits
    return attempt


def wait_until_waiting_for_a_lock(db, application_name: str | None = None, pid: int | None = None) -> None:
    """Until a session (by backend pid, or else the one with that application_name) waits on a lock."""
    deadline = time.monotonic() + 10
    while not db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND (pid = %s OR (%s::int IS NULL AND application_name = %s))",
                         [pid, pid, application_name]).fetchone()[0]:
        assert time.monotonic() < deadline, "the statement never waited for the lock"
        time.sleep(0.02)


def pending(db, job_id: int):
    row = db.execute("SELECT pending_errors FROM skiplock.job_attempts WHERE job_id = %s", [job_id]).fetchone()
    return None if row is None else row[0]


def errors_of(db, job_id: int) -> tuple[str, str | None, list[tuple[int, str]]]:
    state, last_error, errors = db.execute("SELECT state, last_error, errors FROM skiplock.jobs WHERE id = %s",
                                           [job_id]).fetchone()
    return state, last_error, [(e["attempt"], e["error"]) for e in errors]


def test_skipped_record_keeps_the_error_through_a_rolled_back_fold_until_a_committed_one(app, dsn, db):
    job_id = app.enqueue("a", {})
    assert attempt_whose_record_is_skipped(app, dsn, job_id, "boom") == 1
    assert [(e["attempt"], e["error"]) for e in pending(db, job_id)] == [(1, "boom")]
    shown = app.get_job(job_id)  # readers see it already
    assert shown.state.value == "queued" and shown.last_error == "boom" and shown.attempts == 1
    assert [(e["attempt"], e["error"]) for e in shown.errors] == [(1, "boom")]

    # attempt 2 completes in its lease transaction (folding the pending error), but its session dies
    # before COMMIT: the fold rolls back with it, and the error is still pending
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt, _, unrecorded = start_attempt(app, job)
        assert (attempt, unrecorded) == (2, "boom")
        assert app.backend.complete(lease, job, attempt, None, job.claimed_at, "w")
        lease.rollback()
    assert [(e["attempt"], e["error"]) for e in pending(db, job_id)] == [(1, "boom")]
    assert errors_of(db, job_id) == ("queued", None, [])

    # attempt 3 fails, recorded in its transaction, and commits: the pending error is recorded first
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        assert app.backend.record_outcome(lease, job, attempt, state="queued", delay=0, error="bang",
                                          started_at=job.claimed_at, worker="w") == "queued"
        lease.commit()
    assert errors_of(db, job_id) == ("queued", "bang", [(1, "boom"), (3, "bang")])
    assert pending(db, job_id) is None  # folded and taken out; the attempt count stays
    assert db.execute("SELECT started FROM skiplock.job_attempts WHERE job_id = %s", [job_id]).fetchone()[0] == 3

    # attempt 4 is done: its row leaves job_attempts, nothing is recorded twice
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        assert app.backend.complete(lease, job, attempt, None, job.claimed_at, "w")
        lease.commit()
    assert errors_of(db, job_id) == ("done", "bang", [(1, "boom"), (3, "bang")])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_done_folds_pending_errors_of_several_attempts_in_order(app, dsn, db):
    job_id = app.enqueue("a", {})
    attempt_whose_record_is_skipped(app, dsn, job_id, "first")
    attempt_whose_record_is_skipped(app, dsn, job_id, "second")
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        assert app.backend.complete(lease, job, attempt, '"ok"', job.claimed_at, "w")
        lease.commit()
    assert errors_of(db, job_id) == ("done", "second", [(1, "first"), (2, "second")])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_the_last_attempt_s_unrecorded_error_fails_the_job_with_that_error(app, dsn, db):
    """max_attempts=1: the only attempt's record was skipped. The next claim finds every attempt used
    up, and the job fails with that attempt's own error (recorded once), not 'gave up'."""
    ran = []

    @app.task(name="a", max_attempts=1)
    def a(job):
        ran.append(job.id)

    job_id = app.enqueue("a", {})
    attempt_whose_record_is_skipped(app, dsn, job_id, "JobTimeout: job exceeded its timeout of 1s")
    app.worker(concurrency=1, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert ran == []
    assert errors_of(db, job_id) == ("failed", "JobTimeout: job exceeded its timeout of 1s",
                                     [(1, "JobTimeout: job exceeded its timeout of 1s")])
    assert db.execute("SELECT attempts FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_a_batch_s_done_folds_pending_errors(app, dsn, db):
    first, second = app.enqueue_many([("a", {}), ("a", {})])
    attempt_whose_record_is_skipped(app, dsn, first, "boom")
    with psycopg.connect(dsn) as lease:
        jobs = claim(app, lease, limit=2)
        book = app.backend.connect_bookkeeping()
        try:
            batch, suspects, _ = app.backend.start_batch(book, jobs, "w", lease.info.backend_pid)
        finally:
            book.close()
        assert suspects == {first}  # (the executor would run it alone; the fold is the same either way)
        written = app.backend.complete_batch(lease, batch, [(j, j.attempts + 1, None) for j in jobs],
                                             jobs[0].claimed_at, "w")
    assert written == {first, second}
    assert errors_of(db, first) == ("done", "boom", [(1, "boom")])
    assert errors_of(db, second) == ("done", None, [])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_cancelling_a_queued_job_folds_pending_errors(app, dsn, db):
    job_id = app.enqueue("a", {})
    attempt_whose_record_is_skipped(app, dsn, job_id, "boom")
    assert app.cancel_job(job_id, reason="no longer needed").value == "cancelled"
    assert errors_of(db, job_id) == ("cancelled", "cancelled: no longer needed", [(1, "boom")])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_an_entry_is_kept_only_while_the_job_is_queued_and_its_attempt_is_counted(app, dsn, db):
    """A skipped record of a job already finished (a lost COMMIT reply) keeps nothing."""
    job_id = app.enqueue("a", {})
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        assert app.backend.complete(lease, job, attempt, None, job.claimed_at, "w")
        lease.commit()
    assert app.backend.record_outcome(None, job, attempt, state="queued", delay=0, error="late",
                                      started_at=now(), worker="w") is None
    assert errors_of(db, job_id) == ("done", None, [])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def running_claimed(app, dsn):
    """A job claimed under a claimed lease and committed 'running': (id, claimed job, attempt, owner)."""
    job_id, owner = app.enqueue("a", {}), uuid.uuid4()
    with psycopg.connect(dsn) as lease:
        (job,) = claim(app, lease)
        attempt, _ = app.backend.start_claimed(lease, job, owner, 30, "w")
        lease.commit()
    return job_id, job, attempt, owner


def test_claimed_lease_failure_record_waits_for_a_short_lock_instead_of_looking_lost(app, dsn, db):
    """A heartbeat (or the rescuer, or a cancellation) holding the running row for a moment must not
    make the owner's fenced failure record look refused: it waits for the row, then writes."""
    job_id, job, attempt, owner = running_claimed(app, dsn)
    result: dict[str, object] = {}
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM skiplock.jobs WHERE id = %s FOR UPDATE", [job_id])

        def record() -> None:
            result["written"] = app.backend.record_outcome(None, job, attempt, state="failed", delay=None,
                                                           error="boom", started_at=job.claimed_at, worker="w",
                                                           owner=owner)

        thread = threading.Thread(target=record)
        thread.start()
        wait_until_waiting_for_a_lock(db, application_name="skiplock")  # the pooled connection it runs on
        assert "written" not in result
        holder.commit()
        thread.join(10)
    assert result == {"written": "failed"}
    assert errors_of(db, job_id) == ("failed", "boom", [(1, "boom")])


@pytest.mark.parametrize("new_owner", [True, False])
def test_claimed_lease_failure_record_stays_fenced(app, dsn, db, new_owner):
    """Waiting does not weaken the fence: a job rescued (or re-claimed by another owner) meanwhile is
    not written, and no error is kept for it."""
    job_id, job, attempt, owner = running_claimed(app, dsn)
    with psycopg.connect(dsn) as holder:
        # what the rescuer does, holding the row while the owner's record waits for it
        holder.execute("UPDATE skiplock.jobs SET state = 'queued', owner = NULL, lease_expires_at = NULL "
                       "WHERE id = %s", [job_id])
        if new_owner:
            holder.execute("UPDATE skiplock.jobs SET state = 'running', owner = %s, lease_expires_at = now() "
                           "WHERE id = %s", [uuid.uuid4(), job_id])
        result: dict[str, object] = {}
        thread = threading.Thread(target=lambda: result.update(written=app.backend.record_outcome(
            None, job, attempt, state="failed", delay=None, error="late", started_at=now(), worker="w", owner=owner)))
        thread.start()
        wait_until_waiting_for_a_lock(db, application_name="skiplock")
        holder.commit()
        thread.join(10)
    assert result == {"written": None}
    state, last_error, errors = errors_of(db, job_id)
    assert (state, last_error, errors) == ("running" if new_owner else "queued", None, [])
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_a_fold_takes_out_only_the_entries_it_recorded(app, dsn, db):
    """An entry appended while a fold is under way (another worker's skipped record, committed after
    the fold's snapshot) is not wiped by it: it stays pending for the next finishing write."""
    job_id = app.enqueue("a", {})
    attempt_whose_record_is_skipped(app, dsn, job_id, "first")
    late = '[{"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "late", "worker": "other"}]'
    with psycopg.connect(dsn) as lease, psycopg.connect(dsn) as other:
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        # the other worker's append holds the job_attempts row until it commits
        other.execute("UPDATE skiplock.job_attempts SET pending_errors = pending_errors || %s::jsonb "
                      "WHERE job_id = %s", [late, job_id])
        result: dict[str, object] = {}
        thread = threading.Thread(target=lambda: result.update(written=app.backend.record_outcome(
            lease, job, attempt, state="queued", delay=0, error="second", started_at=job.claimed_at, worker="w")))
        thread.start()
        wait_until_waiting_for_a_lock(db, pid=lease.info.backend_pid)
        other.commit()
        thread.join(10)
        assert result == {"written": "queued"}
        lease.commit()
    assert errors_of(db, job_id) == ("queued", "second", [(1, "first"), (2, "second")])
    assert [(e["attempt"], e["error"]) for e in pending(db, job_id)] == [(1, "late")]
    with psycopg.connect(dsn) as lease:  # the next finishing write records it
        (job,) = claim(app, lease)
        attempt = start_attempt(app, job)[0]
        assert app.backend.complete(lease, job, attempt, None, job.claimed_at, "w")
        lease.commit()
    assert errors_of(db, job_id) == ("done", "late", [(1, "first"), (2, "second"), (1, "late")])
