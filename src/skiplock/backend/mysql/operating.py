"""Operating on MySQL/MariaDB: cancel, retry, pause/resume, prune; reads; workers' presence and the
rescuer."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from .connections import MySQLConnections
from ...errors import DatabaseError, DatabaseUnavailable
from ..base import NewJob
from .sql import _job, _naive_utc, _utc

RETRY_ATTEMPTS = 5
# InnoDB purges deleted rows in the background (no vacuum): the pruner's pass is bounded by this
# many rows / 2 so one pass never holds many row locks or bloats the undo log.
PRUNE_PASS_ROWS = 2000.0


class Operating(MySQLConnections):
    # ---- lifecycle -----------------------------------------------------------------------------

    def request_cancel(self, job_id: int, reason: str) -> str | None:
        """Record the request; returns the job's state (None: no such job)."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["request_cancel"], {"id": job_id, "reason": reason})
            cur.execute(self.q["job_state"], {"id": job_id})
            row = cur.fetchone()
        return None if row is None else row[0]

    def cancel_if_unlocked(self, job_id: int) -> bool:
        """Cancel a queued job nobody holds (never waits); its pending errors folded in, its waiters
        notified. False if a lease holds it or it is not queued."""
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["cancel_if_unlocked"], {"id": job_id})
            if cur.fetchone() is None:
                return False
            cur.execute(self.q["cancel_now"], {"id": job_id})
            done = cur.rowcount == 1
            if done:
                cur.execute(self.q["forget_cancellation"], {"id": job_id})
                self._after_finish(cur, [job_id], pending_last_error=False)
        return done

    def cancel_running(self, job_id: int) -> bool:
        """A claimed-lease job running: cancelled now (its owner's fenced write is then refused)."""
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["cancel_running"], {"id": job_id})
            if cur.rowcount != 1:
                return False
            cur.execute(self.q["forget_cancellation"], {"id": job_id})
            self._after_finish(cur, [job_id], pending_last_error=False)
        return True

    def end_lease_holder(self, job_id: int) -> bool:
        """KILL the session holding the job's transaction lease (its transaction rolls back, the job
        is queued again); False if no session holds it now (see ``lease_holders``)."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["lease_holders"], {"id": job_id})
            sessions = [int(r[0]) for r in cur.fetchall()]
        self.terminate(sessions)
        return bool(sessions)

    def add_waiter(self, job_id: int) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["add_waiter"], {"id": job_id})

    def remove_waiter(self, job_id: int) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["remove_waiter"], {"id": job_id})

    def forget_cancel_request(self, job_id: int) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["forget_cancellation"], {"id": job_id})

    def cancel_failed_head(self, job_id: int, reason: str) -> bool:
        """No sequences on this backend (docs/mysql.md): no failed job holds one, so never (False)."""
        return False

    def retry_job(self, job_id: int) -> bool:
        """Queue a failed/cancelled job again; False if it is not one, or its unique key is held."""
        try:
            with self._transaction() as c, c.cursor() as cur:
                cur.execute(self.q["retry_job"], {"id": job_id})
                return cur.rowcount == 1
        except Exception as exc:  # noqa: BLE001 - translated: 1062, the key is held
            if getattr(exc, "sqlstate", None) == "1062":
                return False
            raise

    def queue_known(self, queue: str) -> bool:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["queue_known"], {"queue": queue})
            return bool(cur.fetchone()[0])

    def pause_queue(self, queue: str) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["pause_queue"], {"queue": queue})

    def resume_queue(self, queue: str) -> bool:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["resume_queue"], {"queue": queue})
            return cur.rowcount == 1

    def paused_queues(self) -> list[str]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["paused_queues"])
            return [r[0] for r in cur.fetchall()]

    def prune(self, state: str, age_seconds: float, batch: int) -> int | None:
        """Delete up to ``batch`` finished jobs of ``state`` older than ``age_seconds``; the count."""
        if state not in ("done", "failed", "cancelled"):
            return 0  # never a queued or running job (they have no finished_at either)
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["prune"], {"state": state, "age_us": int(age_seconds * 1_000_000), "batch": batch})
            return int(cur.rowcount)

    # ---- reading -------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["get_job"], {"id": job_id})
            row = cur.fetchone()
        return None if row is None else _job(row)

    def list_jobs(self, *, state: str | None = None, queue: str | None = None, task: str | None = None,
                  limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["list_jobs"], {"state": state, "queue": queue, "task": task, "limit": limit,
                                              "before": before})
            return [_job(r) for r in cur.fetchall()]

    def counts(self) -> list[tuple[str, str, int]]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["counts"])
            return [(r[0], r[1], int(r[2])) for r in cur.fetchall()]

    # ---- workers (worker/presence.py) and the rescuer -----------------------------------------

    def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None, *,
                    host: str | None = None, pid: int | None = None, concurrency: int | None = None) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["forget_stale_workers"], {"id": str(worker_id)})
            cur.execute(self.q["worker_seen"], {
                "id": str(worker_id), "name": name, "tasks": json.dumps(list(tasks)),
                "queues": None if queues is None else json.dumps(list(queues)), "host": host, "pid": pid,
                "concurrency": concurrency})

    def worker_gone(self, worker_id: uuid.UUID) -> None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["worker_gone"], {"id": str(worker_id)})

    def live_workers(self, live_seconds: float) -> int:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["live_workers"], {"live_us": int(live_seconds * 1_000_000)})
            return int(cur.fetchone()[0])

    def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]:
        """Claimed leases that expired: queued again, or failed after their last attempt; [(id, state)]."""
        out: list[tuple[int, str]] = []
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["expired_leases"], {"batch": batch})
            for job_id, attempts, max_attempts in cur.fetchall():
                state = "failed" if attempts >= max_attempts else "queued"
                cur.execute(self.q["rescue_one"], {"id": job_id, "state": state})
                if cur.rowcount == 1:
                    out.append((int(job_id), state))
            failed = [i for i, st in out if st == "failed"]
            if failed:
                self._after_finish(cur, failed)
        return out

    # ---- the read model (readmodel.py; see the section in queries.sql) -------------------------

    def _rows(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q[name], params)
            return [tuple(_utc(v) for v in r) for r in cur.fetchall()]

    def running_now(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [(int(r[0]), *r[1:4], int(r[4]), int(r[5]), r[6], None if r[7] is None else int(r[7]), *r[8:])
                for r in self._rows("running_now", {"after": after, "limit": limit})]

    def batches_in_flight(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [(int(r[0]), r[1], None if r[2] is None else int(r[2]), r[3], int(r[4]))
                for r in self._rows("batches_in_flight", {"after": after, "limit": limit})]

    def live_worker_rows(self, live_seconds: float, after: tuple[datetime, uuid.UUID] | None,
                         limit: int) -> list[tuple[Any, ...]]:
        started, worker_id = after if after is not None else (None, None)
        rows = self._rows("live_worker_rows", {"live_us": int(live_seconds * 1_000_000),
                                               "after_started": _naive_utc(started),
                                               "after_id": None if worker_id is None else str(worker_id),
                                               "limit": limit})
        return [(uuid.UUID(r[0]), r[1], r[2], r[3], json.loads(r[4]), None if r[5] is None else json.loads(r[5]),
                 r[6], r[7], r[8], int(r[9]), r[10]) for r in rows]

    def audit_write(self, actor: str, action: str, target: Mapping[str, Any], affected: int) -> int:
        """One row of the dashboard's audit log (migration 5); its id."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["audit_write"], {"actor": actor, "action": action, "affected": int(affected),
                                                "target": json.dumps(dict(target), default=str)})
            return int(cur.lastrowid)

    def audit_rows(self, before: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [(int(r[0]), r[1], r[2], r[3], json.loads(r[4]), int(r[5]))
                for r in self._rows("audit_rows", {"before": before, "limit": limit})]

    def failure_classes(self, since: datetime | None = None) -> list[tuple[Any, ...]]:
        return [(r[0], r[1], int(r[2]), r[3]) for r in self._rows("failure_classes", {"since": _naive_utc(since)})]

    def oldest_ready(self) -> list[tuple[Any, ...]]:
        return [(r[0], int(r[1]), r[2], timedelta(microseconds=int(r[3])), bool(r[4]))
                for r in self._rows("oldest_ready", {})]

    def untakeable(self, live_seconds: float) -> list[tuple[str, str, int]]:
        """(queue, task, queued jobs) that no worker seen within ``live_seconds`` can take."""
        return [(r[0], r[1], int(r[2])) for r in self._rows("untakeable", {"live_us": int(live_seconds * 1_000_000)})]

    # ---- retry of failed jobs, cron, maintenance -----------------------------------------------

    def retry_failed(self, queue: str | None) -> list[tuple[int, str | None, bool, int | None]]:
        """One row per failed job (of ``queue``), in id order: (id, unique_key, retried, id of the job
        holding its key when not retried -- an active job, or the lower failed id retried for it now)."""
        for _ in range(RETRY_ATTEMPTS):
            try:
                return self._retry_failed(queue)
            except DatabaseError as exc:
                if exc.sqlstate != "1062":  # a key taken meanwhile: run again, seeing the holder
                    raise
        raise DatabaseUnavailable(f"unique keys of failed jobs kept changing hands over {RETRY_ATTEMPTS} "
                                  "attempts; try again")

    def _retry_failed(self, queue: str | None) -> list[tuple[int, str | None, bool, int | None]]:
        out: list[tuple[int, str | None, bool, int | None]] = []
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["failed_jobs"], {"queue": queue})
            first: dict[str, int] = {}
            for job_id, key, holder in cur.fetchall():
                job_id = int(job_id)
                if key is not None and holder is None and key not in first:
                    first[key] = job_id
                    out.append((job_id, key, True, None))
                elif key is not None:
                    out.append((job_id, key, False, int(holder) if holder is not None else first[key]))
                else:
                    out.append((job_id, None, True, None))
            ids = [r[0] for r in out if r[2]]
            if ids:
                cur.execute(self.q["retry_these"], {"ids": ids})
                cur.execute(self.q["forget_attempts_of"], {"ids": ids})
        return out

    def enqueue_tick(self, schedule: str, tick: datetime, job: NewJob) -> int | None:
        """Enqueue ``job`` for this tick unless some scheduler already did; returns the new job id."""
        with self._transaction() as c, c.cursor() as cur:
            cur.execute(self.q["insert_tick"], {"schedule": schedule, "tick": _naive_utc(tick)})
            if cur.rowcount != 1:
                return None
            job_id = self._enqueue_on(c, [job])[0]  # type: ignore[attr-defined]  # Producing's
            cur.execute(self.q["set_tick_job"], {"schedule": schedule, "tick": _naive_utc(tick), "job_id": job_id})
            return int(job_id)

    def last_tick(self, schedule: str) -> datetime | None:
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["last_tick"], {"schedule": schedule})
            value = cur.fetchone()[0]
        return _utc(value)  # type: ignore[no-any-return]

    def prune_ticks(self, age_seconds: float) -> None:
        """Ticks older than ``age_seconds``, the rows of dead batches none of whose jobs is queued
        any more, and notices older than a minute."""
        with self._conn() as c, c.cursor() as cur:
            cur.execute(self.q["prune_ticks"], {"age_us": int(age_seconds * 1_000_000)})
            cur.execute(self.q["dead_batches"])
            dead = [int(r[0]) for r in cur.fetchall()]
            if dead:
                cur.execute(self.q["forget_batches"], {"ids": dead})
            cur.execute(self.q["prune_notices"])

    def jobs_vacuum_threshold(self) -> float:
        """No vacuum on InnoDB (purge is the server's, in the background): a fixed pass size."""
        return PRUNE_PASS_ROWS
