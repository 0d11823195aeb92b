"""The lease verbs on MySQL/MariaDB: the claim (SKIP LOCKED, then updates by primary key; 1213/1205
retried), attempts, savepoints, the finishing writes (``finish``), KILL."""

from __future__ import annotations

import random
import time
import uuid
from datetime import datetime
from typing import Any, Sequence

import pymysql

from ..base import ClaimedJob, Finish, Lease, Via
from .errors import RETRYABLE, code, connection_lost, translate
from .connections import MySQLConnections
from .lease import MySQLLease
from .sql import CLAIM_RETRIES, NOT_YET, _claimed, _naive_utc


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
        Returns (attempt, cancellation reason or None, None -- pending errors are not kept on MySQL
        yet --, suspect)."""
        params = {"id": job.id, "attempts": job.attempts, "worker": worker, "backend_pid": lease_pid,
                  "exclusive": bool(exclusive)}
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["start_attempt"], params)
            cur.execute(self.q["attempt_started"], {"id": job.id})
            started, reason, suspect = cur.fetchone()
        return int(started), reason, None, bool(suspect)

    def mark_exclusive(self, conn: Any, job_id: int, attempt: int) -> None:
        with self._on(conn) as raw, raw.cursor() as cur:
            cur.execute(self.q["mark_exclusive"], {"id": job_id, "attempt": attempt})

    def start_batch(self, conn: Any, jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]:
        raise NotImplementedError(f"batches are {NOT_YET} (capabilities.batched_claims is False)")

    def forget_dead_batches(self, conn: Any, job_id: int, batch: int) -> None:
        raise NotImplementedError(f"batches are {NOT_YET}")

    def complete_batch(self, conn: Any, batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]:
        raise NotImplementedError(f"batches are {NOT_YET}")

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

    def _complete_on(self, raw: Any, job: ClaimedJob, attempt: int, result_json: str | None,
                     started_at: datetime, worker: str, owner: uuid.UUID | None) -> bool:
        with raw.cursor() as cur:
            cur.execute(self.q["complete"], {"id": job.id, "attempt": attempt, "result": result_json,
                                             "started_at": _naive_utc(started_at), "worker": worker,
                                             "owner": None if owner is None else str(owner)})
            done = cur.rowcount == 1
            if done:
                cur.execute(self.q["forget_attempts"], {"id": job.id})
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
                    error: str | None, started_at: datetime, worker: str, uncount: bool) -> str | None:
        with raw.cursor() as cur:
            cur.execute(self.q["lock_for_outcome"], {"id": job.id})
            if cur.fetchone() is None:
                return None  # not ours: locked by another session, or already finished
            cur.execute(self.q["cancellation_reason"], {"id": job.id})
            row = cur.fetchone()
            written = "cancelled" if row is not None else state
            last_error = f"cancelled: {row[0]}" if row is not None else error
            cur.execute(self.q["record_outcome"], {
                "id": job.id, "state": written, "attempt": attempt, "delay": delay,
                "delay_us": int((delay or 0) * 1_000_000), "started_at": _naive_utc(started_at),
                "last_error": last_error, "error": error, "worker": worker})
            if written != "queued":
                cur.execute(self.q["forget_attempts"], {"id": job.id})
                cur.execute(self.q["forget_cancellation"], {"id": job.id})
            elif uncount:
                cur.execute(self.q["uncount_attempt"], {"id": job.id})
        return written

    def record_outcome(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str, delay: float | None,
                       error: str | None, started_at: datetime, worker: str, uncount: bool = False,
                       owner: uuid.UUID | None = None) -> str | None:
        """Write a retry/failed/cancelled outcome; the state written, or None if the row was not ours
        (from a fresh transaction: still locked by another session -- skipped, never waited on)."""
        if owner is not None:
            raise NotImplementedError(f"the claimed lease is {NOT_YET}")
        if conn is None:
            with self._transaction() as c:
                return self._outcome_on(c, job, attempt, state, delay, error, started_at, worker, uncount)
        with self._on(conn) as raw:
            return self._outcome_on(raw, job, attempt, state, delay, error, started_at, worker, uncount)

    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The worker's one finishing write (base.Finish); raises only skiplock errors."""
        if what.via is Via.BATCH_COMMIT:
            raise NotImplementedError(f"batches are {NOT_YET}")
        (w,) = what.writes
        conn = None if lease is None or what.via is Via.FRESH else lease.conn
        if w.state == "done":
            done = self.complete(conn, w.job, w.attempt, w.result, w.started_at, w.worker, w.owner)
            return {w.job.id: "done"} if done else {}
        if w.undo and conn is not None:
            self.rollback_to_savepoint(conn)
        state = self.record_outcome(conn, w.job, w.attempt, state=w.state, delay=w.delay, error=w.error,
                                    started_at=w.started_at, worker=w.worker, uncount=w.uncount, owner=w.owner)
        return {} if state is None else {w.job.id: state}
