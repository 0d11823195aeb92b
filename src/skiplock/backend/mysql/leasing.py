"""The lease verbs on MySQL/MariaDB: the claim (SKIP LOCKED, then updates by primary key; 1213/1205
retried), attempts, savepoints, the finishing writes (``finish``), KILL."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import datetime
from typing import Any, Sequence

import pymysql

from ..base import ClaimedJob, Finish, Lease
from ..finishing import dispatch
from .errors import RETRYABLE, code, connection_lost, translate
from .connections import MySQLConnections
from .lease import MySQLLease
from .sql import CLAIM_RETRIES, _claimed, _naive_utc


class Leasing(MySQLConnections):
    # ---- the transaction lease -----------------------------------------------------------------

    def claim(self, conn: Any, queues: Sequence[str] | None, limit: int = 1, savepoint: bool = False,
              tasks: Sequence[str] | None = None) -> list[ClaimedJob]:
        """Lock up to ``limit`` available jobs in the lease's transaction (see ``claim`` in
        queries.sql). A deadlock (1213: InnoDB rolled the transaction back) or a lock wait timeout
        (1205: only the statement) rolls the attempt back and retries, up to CLAIM_RETRIES times
        with jitter; then the last one is raised as DatabaseError. With ``savepoint``, the first
        job's SAVEPOINT follows."""
        raw = self._raw(conn)
        if queues and len(queues) == 1:
            query = self.q["claim" if tasks is None else "claim_tasks"]
            params: dict[str, Any] = {"queue": queues[0], "limit": limit}
            if tasks is not None:
                params["tasks"] = list(tasks) or [""]
        else:
            query = self.q["claim_any_queue"]
            params = {"all_queues": 0 if queues else 1, "queues": list(queues) if queues else [""],
                      "all_tasks": 0 if tasks is not None else 1, "tasks": list(tasks) if tasks else [""],
                      "limit": limit}
        for attempt in range(CLAIM_RETRIES):
            try:
                with raw.cursor() as cur:
                    cur.execute(query, params)
                    rows = cur.fetchall()
                    if savepoint:
                        cur.execute(self.q["savepoint"])
                return [_claimed(r) for r in rows]
            except pymysql.err.MySQLError as exc:
                if code(exc) not in RETRYABLE or attempt == CLAIM_RETRIES - 1:
                    if isinstance(conn, MySQLLease) and not connection_lost(exc):
                        conn.refused = True
                    raise translate(exc, self.dsn) from None
                try:
                    raw.rollback()
                except pymysql.err.MySQLError as again:
                    raise translate(again, self.dsn) from None
                time.sleep(random.uniform(0, 0.01 * 2 ** attempt))
        return []

    def start_attempt(self, conn: Any, job: ClaimedJob, worker: str, lease_pid: int | None,
                      exclusive: bool = True, batch: int | None = None) -> tuple[int, str | None, str | None, bool]:
        """Count the attempt on the bookkeeping session (see ``start_attempt`` in queries.sql).
        Returns (attempt, cancellation reason or None, the previous attempt's error if it finished
        but its outcome is still pending, suspect). ``batch``: the live batch the job runs in; a job
        still listed by a dead batch is a suspect, and leaves that batch's rows."""
        params = {"id": job.id, "attempts": job.attempts, "worker": worker, "backend_pid": lease_pid,
                  "exclusive": bool(exclusive), "batch": batch}
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["start_attempt"], params)
            cur.execute(self.q["attempt_started"], params)
            started, reason, suspect, unrecorded, in_dead_batch = cur.fetchone()
            if in_dead_batch:
                cur.execute(self.q["leave_dead_batches"], params)
                cur.execute(self.q["mark_suspect"], params)
        return int(started), reason, unrecorded, bool(suspect) or bool(in_dead_batch)

    def mark_exclusive(self, conn: Any, job_id: int, attempt: int) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["mark_exclusive"], {"id": job_id, "attempt": attempt})

    def start_batch(self, conn: Any, jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]:
        """Mark a batch durably on the bookkeeping session (one short transaction), before its first
        handler starts. Returns (batch id, suspects: jobs to run alone with a counted attempt,
        {job id: cancellation reason})."""
        ids = [j.id for j in jobs]
        with self._on(conn) as raw:
            raw.begin()
            try:
                with raw.cursor() as cur:
                    cur.execute(self.q["batch_suspects"], {"ids": ids})
                    suspects = {int(r[0]) for r in cur.fetchall()}
                    cur.execute(self.q["batch_cancellations"], {"ids": ids})
                    reasons = {int(r[0]): r[1] for r in cur.fetchall()}
                    cur.execute(self.q["start_batch"], {"worker": worker, "backend_pid": lease_pid})
                    batch = int(cur.lastrowid)
                    rows = ", ".join([self.q["batch_job_row"]] * len(ids))
                    cur.execute(self.q["batch_jobs"].replace("{rows}", rows), [v for i in ids for v in (i, batch)])
                raw.commit()
            except BaseException:
                if raw.open:
                    raw.rollback()
                raise
        return batch, suspects, reasons

    def forget_dead_batches(self, conn: Any, job_id: int, batch: int) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["forget_dead_batches"], {"id": job_id, "batch": batch})

    def complete_batch(self, conn: Any, batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]:
        """End the batch's transaction: write ``done`` ((job, attempt, result JSON)) in one statement,
        fold pending errors, delete the batch's rows, notify waiters, COMMIT. Returns the ids written;
        a job missing was refused (a cancellation was requested) and is still queued, unlocked."""
        written: list[int] = []
        with self._on(conn) as raw:
            with raw.cursor() as cur:
                if done:
                    rows = " UNION ALL ".join([self.q["complete_batch_row"]] * len(done))
                    params: list[Any] = [v for job, attempt, result in done for v in (job.id, attempt, result)]
                    cur.execute(self.q["complete_batch"].replace("{rows}", rows),
                                params + [_naive_utc(started_at), worker])
                    cur.execute(self.q["done_of"], {"ids": [job.id for job, _, _ in done]})
                    written = [int(r[0]) for r in cur.fetchall()]
                    if written:
                        self._after_finish(cur, written)
                cur.execute(self.q["end_batch"], {"batch": batch})
            raw.commit()
            if isinstance(conn, MySQLLease):
                conn.refused = False
        return set(written)

    def savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["savepoint"])

    def rollback_to_savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["rollback_to_savepoint"])

    def release_savepoint(self, conn: Any) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["release_savepoint"])

    def set_local_timeouts(self, conn: Any, seconds: float) -> None:
        """Nothing: the server cannot bound a transaction's duration (the watchdog does)."""

    # ---- finishing writes -----------------------------------------------------------------------

    def _complete_on(self, raw: Any, job: ClaimedJob, attempt: int, result_json: str | None,
                     started_at: datetime, worker: str, owner: uuid.UUID | None) -> bool:
        with raw.cursor() as cur:
            cur.execute(self.q["complete"], {"id": job.id, "attempt": attempt, "result": result_json,
                                             "started_at": _naive_utc(started_at), "worker": worker,
                                             "owner": None if owner is None else str(owner)})
            done = cur.rowcount == 1
            if done:
                self._after_finish(cur, [job.id])
        return done

    def complete(self, conn: Any, job: ClaimedJob, attempt: int, result_json: str | None, started_at: datetime,
                 worker: str, owner: uuid.UUID | None = None) -> bool:
        """Write ``done`` in the lease (guarded: see ``complete`` in queries.sql); False if refused.
        ``conn`` None: a pooled transaction, committed at once."""
        if conn is None:
            with self._transaction() as c:
                return self._complete_on(c, job, attempt, result_json, started_at, worker, owner)
        with self._on(conn) as raw:
            return self._complete_on(raw, job, attempt, result_json, started_at, worker, owner)

    def _outcome_on(self, raw: Any, job: ClaimedJob, attempt: int, state: str, delay: float | None,
                    error: str | None, started_at: datetime, worker: str, uncount: bool,
                    owner: uuid.UUID | None) -> str | None:
        with raw.cursor() as cur:
            if owner is not None:
                cur.execute(self.q["lock_claimed_for_outcome"], {"id": job.id, "owner": str(owner)})
                if cur.fetchone() is None:
                    return None  # fenced off: rescued, another owner, or finished
            else:
                cur.execute(self.q["lock_for_outcome"], {"id": job.id})
                if cur.fetchone() is None:  # not ours: locked by another session, or already finished
                    if error is not None:
                        self._keep_pending(cur, job, attempt, error, worker)
                    return None
            (has_row, pending, waited), = self._finishing_rows(cur, [job.id]).values()
            cur.execute(self.q["cancellation_reason"], {"id": job.id})
            row = cur.fetchone()
            written = "cancelled" if row is not None else state
            last_error = f"cancelled: {row[0]}" if row is not None else error
            own = error is not None and not any(
                e.get("attempt") == attempt and e.get("error") == error for e in pending or ())
            cur.execute(self.q["record_outcome"], {
                "id": job.id, "state": written, "attempt": attempt, "delay": delay,
                "delay_us": int((delay or 0) * 1_000_000), "started_at": _naive_utc(started_at),
                "last_error": last_error, "error": error, "worker": worker,
                "owner": None if owner is None else str(owner), "own": int(own),
                "pending": json.dumps(pending or []), "pending_last": pending[-1].get("error") if pending else None})
            if written != "queued":
                if has_row:
                    cur.execute(self.q["forget_attempts"], {"id": job.id})
                cur.execute(self.q["forget_cancellation"], {"id": job.id})
                if waited:
                    self._notify(cur, [job.id])
            else:
                if pending:
                    cur.execute(self.q["clear_pending"], {"id": job.id})
                if uncount and has_row:
                    cur.execute(self.q["uncount_attempt"], {"id": job.id})
        return written

    def _keep_pending(self, cur: Any, job: ClaimedJob, attempt: int, error: str, worker: str) -> None:
        """The row is still locked by another session (transaction lease, a fresh transaction): keep
        the error on the job's attempt row, never waiting (see ``keep_pending_error``)."""
        cur.execute(self.q["still_queued"], {"id": job.id})
        if cur.fetchone() is None:
            return  # finished meanwhile: nothing to keep
        cur.execute(self.q["lock_attempt_row"], {"id": job.id})
        if cur.fetchone() is None:
            return  # no attempt row, or a finishing write holds it (and records the job's outcome)
        cur.execute(self.q["keep_pending_error"], {"id": job.id, "attempt": attempt, "error": error,
                                                   "worker": worker})

    def record_outcome(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str, delay: float | None,
                       error: str | None, started_at: datetime, worker: str, uncount: bool = False,
                       owner: uuid.UUID | None = None) -> str | None:
        """Write a retry/failed/cancelled outcome; the state written, or None if the row was not ours:
        from a fresh transaction, still locked by another session -- skipped, never waited on, its
        error kept pending in job_attempts until the job's next finishing write records it; claimed
        lease (``owner``), fenced off."""
        if conn is None:
            with self._transaction() as c:
                return self._outcome_on(c, job, attempt, state, delay, error, started_at, worker, uncount, owner)
        with self._on(conn) as raw:
            return self._outcome_on(raw, job, attempt, state, delay, error, started_at, worker, uncount, owner)

    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The worker's one finishing write (base.Finish; the dispatch is backend/finishing.py's):
        raises only skiplock errors (every verb it calls translates its own)."""
        return dispatch(self, lease, what)

    # ---- the claimed lease -------------------------------------------------------------------

    def start_claimed(self, conn: Any, job: ClaimedJob, owner: uuid.UUID, lease: float,
                      worker: str) -> tuple[int, str | None] | None:
        """In the claim's transaction (the caller commits at once): the row running, ours, counted.
        (attempt, cancellation reason), or None if the row was no longer queued."""
        params = {"id": job.id, "owner": str(owner), "lease_us": int(lease * 1_000_000), "worker": worker}
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["start_claimed"], params)
            if cur.rowcount != 1:
                return None
            cur.execute(self.q["claimed_attempt"], params)
            attempts, reason = cur.fetchone()
        return int(attempts), reason

    def heartbeat(self, leases: Sequence[tuple[int, uuid.UUID, float]]) -> set[int]:
        """Extend these leases, each by an autocommit statement of its own; returns the ids still
        owned. No row lock outlives its statement: in one transaction, a worker frozen (SIGSTOP, a
        stalled VM) between an UPDATE and the COMMIT pinned that job's row, and every other worker's
        rescuer (SKIP LOCKED) passed over the expired lease for as long as the frozen session lived
        (seen: tests/faults/test_fault_mariadb_more.py, the claimed job never rescued)."""
        owned: set[int] = set()
        if not leases:
            return owned
        with self._conn() as c, c.cursor() as cur:
            for job_id, owner, seconds in leases:
                cur.execute(self.q["heartbeat"], {"id": job_id, "owner": str(owner),
                                                  "lease_us": int(seconds * 1_000_000)})
                if cur.rowcount == 1:
                    owned.add(int(job_id))
        return owned
