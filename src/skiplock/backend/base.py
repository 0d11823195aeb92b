"""The backend interface: operations on jobs, not ``execute(sql)``.

A backend owns its SQL and its connections. The worker and the App only call these methods, so a
MySQL 8 / MariaDB 10.6+ backend (the same SKIP LOCKED claim, select-then-update in one transaction)
can slot in without touching them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, Sequence


@dataclass
class ClaimedJob:
    """A row locked by a lease transaction; the lease ends when that transaction does."""

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    claimed_at: datetime


@dataclass(frozen=True)
class NewJob:
    """A validated job ready to insert: ``args_json`` is already serialised and checked."""

    task: str
    args_json: str
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None


class LeaseConnection(Protocol):
    """A connection dedicated to one worker slot; its transaction is the lease."""

    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


class Backend(Protocol):
    schema: str

    # schema
    def migrate(self) -> list[int]: ...
    def check_schema(self) -> None: ...

    # producing
    def enqueue(self, jobs: Sequence[NewJob], conn: Any = None) -> list[int]: ...

    # the lease (runs on a slot's own connection, inside its transaction)
    def connect_lease(self, application_name: str) -> Any: ...
    def claim(self, conn: Any, queues: Sequence[str] | None, limit: int = 1) -> list[ClaimedJob]: ...
    def connect_bookkeeping(self) -> Any: ...
    def start_attempt(self, conn: Any, job: ClaimedJob, worker: str) -> int: ...
    def savepoint(self, conn: Any) -> None: ...
    def rollback_to_savepoint(self, conn: Any) -> None: ...
    def complete(self, conn: Any, job: ClaimedJob, attempt: int, result_json: str | None,
                 started_at: datetime, worker: str) -> bool: ...
    def record_failure(self, conn: Any | None, job: ClaimedJob, attempt: int, *, state: str,
                       delay: float | None, error: str, started_at: datetime, worker: str) -> bool: ...
    def terminate(self, backend_pids: Sequence[int]) -> None: ...

    # reading
    def get_job(self, job_id: int) -> dict[str, Any] | None: ...
    def list_jobs(self, *, state: str | None, queue: str | None, task: str | None, limit: int) -> list[dict[str, Any]]: ...
    def counts(self) -> list[tuple[str, str, int]]: ...

    def close(self) -> None: ...
