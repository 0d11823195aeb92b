"""Operating on PostgreSQL: reads and the read model, workers' presence, cancel/retry/pause,
waiters, retention (prune) and cron ticks."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Mapping, Sequence

import psycopg
from psycopg.rows import dict_row

from ...errors import DatabaseError, DatabaseUnavailable
from ..base import NewJob
from .connecting import row_of
from .errors import UNIQUE_VIOLATION, translate
from .producing import KEYED_ATTEMPTS, Producing

# How long `retire_queue_limit` waits for enqueues holding the queue's row (then: a later pass).
RETIRE_LOCK_TIMEOUT = 0.5

class Operating(Producing):
    # ---- reading -----------------------------------------------------------------------------

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        with self._conn() as c:
            return c.cursor(row_factory=dict_row).execute(self.q["get_job"], {"id": job_id}).fetchone()

    def list_jobs(self, *, state: str | None = None, queue: str | None = None,
                  task: str | None = None, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first; ``before``: the last id of the previous page (keyset). 'running' is read
        through the jobs in flight (``list_running_jobs``), not by scanning every job."""
        name = "list_running_jobs" if state == "running" else "list_jobs"
        with self._conn() as c:
            cur = c.cursor(row_factory=dict_row)
            return cur.execute(self.q[name], {"state": state, "queue": queue, "task": task, "limit": limit,
                                              "before": before}).fetchall()

    def counts(self) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], int(r[2])) for r in self._all("counts", {})]

    # ---- the read model (see skiplock/readmodel.py; statements in queries.sql's read model section) --

    def running_now(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("running_now", {"after": after, "limit": limit})]

    def batches_in_flight(self, after: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("batches_in_flight", {"after": after, "limit": limit})]

    def live_worker_rows(self, live_seconds: float, after: tuple[datetime, uuid.UUID] | None,
                         limit: int) -> list[tuple[Any, ...]]:
        started, worker_id = after if after is not None else (None, None)
        return [tuple(r) for r in self._all("live_worker_rows", {"live": live_seconds, "after_started": started,
                                                                 "after_id": worker_id, "limit": limit})]

    def failure_classes(self, since: datetime | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("failure_classes", {"since": since})]

    def oldest_ready(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._all("oldest_ready", {})]

    # ---- workers running now (their names, tasks and queues, as each says itself) ----------------

    def worker_seen(self, worker_id: uuid.UUID, name: str, tasks: Sequence[str], queues: Sequence[str] | None, *,
                    host: str | None = None, pid: int | None = None, concurrency: int | None = None) -> None:
        self._one("worker_seen", {"id": worker_id, "name": name, "tasks": list(tasks),
                                  "queues": None if queues is None else list(queues),
                                  "host": host, "pid": pid, "concurrency": concurrency})

    def worker_gone(self, worker_id: uuid.UUID) -> None:
        """Delete this worker's row. Raises only skiplock errors."""
        self._one("worker_gone", {"id": worker_id})

    def live_workers(self, live_seconds: float) -> int:
        """How many workers were seen within ``live_seconds``."""
        return int(self._one("live_workers", {"live": live_seconds})[0])

    def untakeable(self, live_seconds: float) -> list[tuple[str, str, int]]:
        """(queue, task, queued jobs) that no worker seen within ``live_seconds`` can take."""
        return [(r[0], r[1], int(r[2])) for r in self._all("untakeable", {"live": live_seconds})]

    # ---- lifecycle ---------------------------------------------------------------------------

    def request_cancel(self, job_id: int, reason: str) -> str | None:
        row = self._one("request_cancel", {"id": job_id, "reason": reason})
        return row[0] if row else None

    def cancel_if_unlocked(self, job_id: int) -> bool:
        return self._one("cancel_if_unlocked", {"id": job_id, "notice": self.notice(job_id)}) is not None

    def end_lease_holder(self, job_id: int) -> bool:
        return self._one("end_lease_holder", {"id": job_id}) is not None

    def forget_cancel_request(self, job_id: int) -> None:
        self._one("forget_cancel_request", {"id": job_id})

    def cancel_failed_head(self, job_id: int, reason: str) -> bool:
        return self._one("cancel_failed_head", {"id": job_id, "reason": reason}) is not None

    def retry_job(self, job_id: int) -> bool:
        """True if the job was put back; False if it does not exist, is not failed or cancelled, or
        a queued or running job holds its unique_key (also one committed during this statement)."""
        try:
            return self._one("retry_job", {"id": job_id}) is not None
        except DatabaseError as exc:
            if exc.sqlstate != UNIQUE_VIOLATION:
                raise
            return False

    def unique_key_holder(self, unique_key: str) -> tuple[int, str] | None:
        """(id, state) of the queued or running job holding ``unique_key``, if any."""
        row = self._one("unique_key_holder", {"unique_key": unique_key})
        return (int(row[0]), row[1]) if row else None

    def retry_failed(self, queue: str | None) -> list[tuple[int, str | None, bool, int | None]]:
        """One row per failed job (of ``queue``), in id order: (id, unique_key, retried, id of the job
        holding its key when not retried). Keys taken while it runs make the statement fail on the
        unique index, undoing it: it runs again, seeing the new holders."""
        for _ in range(KEYED_ATTEMPTS):
            try:
                return [(int(r[0]), r[1], bool(r[2]), r[3]) for r in self._all("retry_failed", {"queue": queue})]
            except DatabaseError as exc:
                if exc.sqlstate != UNIQUE_VIOLATION:
                    raise
        raise DatabaseUnavailable(f"unique keys of failed jobs kept changing hands over {KEYED_ATTEMPTS} attempts; "
                                  "try again")

    def queue_known(self, queue: str) -> bool:
        return bool(self._one("queue_known", {"queue": queue})[0])

    def pause_queue(self, queue: str) -> None:
        self._one("pause_queue", {"queue": queue})

    def resume_queue(self, queue: str) -> bool:
        return self._one("resume_queue", {"queue": queue}) is not None

    def paused_queues(self) -> list[str]:
        return [r[0] for r in self._all("paused_queues")]

    def set_queue_limit(self, queue: str, concurrency: int | None, rate: tuple[int, float] | None,
                        fair: bool = False, weights: Mapping[str, int] | None = None) -> None:
        """A queue's limits (flow control), read by every worker's next claim. A queue that gets
        limits gets its unfinished jobs flagged (``flow``, migration 17), in the same transaction;
        one left with none keeps its row, retiring, until :meth:`retire_queue_limit` can delete it."""
        if concurrency is None and rate is None and not fair:
            self._one("clear_queue_limit", {"queue": queue})
            self.retire_queue_limit(queue)
            return
        with self._conn() as c, c.transaction():
            before = c.execute(self.q["queue_limited_now"], {"queue": queue}).fetchone()
            c.execute(self.q["set_queue_limit"], {"queue": queue, "concurrency": concurrency,
                                                  "rate_count": None if rate is None else rate[0],
                                                  "rate_period": None if rate is None else rate[1],
                                                  "fair": bool(fair), "weights": json.dumps(dict(weights or {}))})
            if before is None or not before[0]:
                c.execute(self.q["flag_queue_jobs"], {"queue": queue})

    def retire_queue_limit(self, queue: str, lock_timeout: float = RETIRE_LOCK_TIMEOUT) -> bool:
        """Delete the row of ``queue`` if it has no limits and no unfinished job of the queue is
        flagged any more (the flags are dropped here first, but those of jobs in a running
        transaction lease); True if deleted. False also when the row stayed locked by enqueues for
        ``lock_timeout`` seconds: a later call (the rescuer's pass) tries again. See
        0017_flow_hint.sql for why the row must outlive every flagged job."""
        with self._conn() as c:
            try:
                with c.transaction():
                    locked = row_of(c.execute(self.q["retire_lock"], {
                        "queue": queue, "lock_timeout": f"{max(1, int(lock_timeout * 1000))}ms"}))[1]
                    if not locked:
                        return False
                    c.execute(self.q["unflag_queue_jobs"], {"queue": queue})
                    return c.execute(self.q["retire_queue_limit"], {"queue": queue}).fetchone() is not None
            except psycopg.errors.LockNotAvailable:
                return False

    def retiring_queues(self) -> list[str]:
        """The queues whose row was left without limits (retiring: see :meth:`set_queue_limit`)."""
        return [q for (q,) in self._all("retiring_queue_limits")]

    def retire_queue_limits(self) -> list[str]:
        """:meth:`retire_queue_limit` for every row without limits; the queues whose row went."""
        return [q for q in self.retiring_queues() if self.retire_queue_limit(q)]

    def queue_limits(self, retiring: bool = False) -> list[tuple[Any, ...]]:
        """(queue, concurrency, rate_count, rate_period, updated_at, fair, weights) per queue with
        limits; with ``retiring``, also the rows left without limits (their queues are still served
        by the flow claim until the row goes: worker/flow.py)."""
        return [tuple(r) for r in self._all("queue_limits", {"retiring": retiring})]

    def set_task_limit(self, task: str, concurrency: int | None, rate: tuple[int, float] | None,
                       clear: bool = False) -> None:
        """A task's limits at runtime, over its code's (``clear``: back to the code's)."""
        if clear:
            self._one("clear_task_limit", {"task": task})
            return
        self._one("set_task_limit", {"task": task, "concurrency": concurrency,
                                     "rate_count": None if rate is None else rate[0],
                                     "rate_period": None if rate is None else rate[1]})

    def task_limits(self) -> list[tuple[Any, ...]]:
        """(task, concurrency, rate_count, rate_period, updated_at) per task with runtime limits."""
        return [tuple(r) for r in self._all("task_limits")]

    def add_waiter(self, job_id: int) -> None:
        self._one("add_waiter", {"id": job_id})

    def remove_waiter(self, job_id: int) -> None:
        self._one("remove_waiter", {"id": job_id})

    def prune(self, state: str, age_seconds: float, batch: int) -> int | None:
        """Delete one batch; None if another process holds the maintenance lock."""
        with self._conn() as c, c.transaction():
            if not row_of(c.execute(self.q["try_maintenance_lock"], {"schema": self.schema}))[0]:
                return None
            return int(row_of(c.execute(self.q["prune"], {"state": state, "age": age_seconds, "batch": batch}))[0])

    def jobs_vacuum_threshold(self) -> float:
        """Dead tuples at which autovacuum vacuums the jobs table (its storage parameters first)."""
        row = self._one("jobs_vacuum_threshold", {"schema": self.schema})
        if row is None or row[0] is None:
            raise RuntimeError(f"no jobs table in schema {self.schema!r}")
        return float(row[0])

    def prune_ticks(self, age_seconds: float) -> None:
        self._one("prune_ticks", {"age": age_seconds})
        self._one("prune_batches", {})

    def enqueue_tick(self, schedule: str, tick: datetime, job: NewJob) -> int | None:
        """Enqueue ``job`` for this tick unless some scheduler already did; returns the new job id."""
        with self._conn() as c, c.transaction():
            if c.execute(self.q["insert_tick"], {"schedule": schedule, "tick": tick}).fetchone() is None:
                return None
            job_id = self.enqueue([job], c)[0]
            c.execute(self.q["set_tick_job"], {"schedule": schedule, "tick": tick, "job_id": job_id})
            return job_id

    def last_tick(self, schedule: str) -> datetime | None:
        return self._one("last_tick", {"schedule": schedule})[0]
