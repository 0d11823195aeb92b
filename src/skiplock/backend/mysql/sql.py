"""The MySQL backend's SQL plumbing: validated, quoted table names; the named statements and the
migration steps loaded from the .sql files; rows to values."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from importlib import resources
from typing import Any, Mapping, Sequence, TypeVar

from ...errors import ConfigurationError
from ..base import ClaimedJob


T = TypeVar("T")

TABLES = ("jobs", "job_attempts", "job_cancellations", "paused_queues", "schema_version", "migration_steps",
          "workers", "job_batches", "job_batch_jobs", "job_waiters", "periodic_ticks", "notices", "outbox",
          "outbox_keys", "audit_log")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LOCK_WAIT_SECONDS = 5  # innodb_lock_wait_timeout of every skiplock session
CLAIM_RETRIES = 5
ENQUEUE_CHUNK = 1000


def quote_identifier(name: str) -> str:
    """A strict quoting: ``name`` must be an unquoted-safe identifier of at most 64 characters
    ([A-Za-z_][A-Za-z0-9_]*), then back-quoted. Anything else is a ConfigurationError."""
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ConfigurationError(f"invalid MySQL identifier {name!r}: letters, digits and _ only, "
                                 "at most 64 characters, not starting with a digit")
    return f"`{name}`"


def names(schema: str) -> dict[str, str]:
    """The quoted table names for ``schema`` (their prefix: MySQL's schema is the DSN's database)."""
    return {t: quote_identifier(f"{schema}_{t}") for t in TABLES}


def _load(filename: str, tables: Mapping[str, str]) -> str:
    text = resources.files(__package__).joinpath(filename).read_text()
    return re.sub(r"\{(" + "|".join(TABLES) + r")\}", lambda m: tables[m.group(1)], text).replace("{{", "{").replace("}}", "}")


def _named(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
        found[name.strip()] = "\n".join(lines).strip().rstrip(";")
    return found


def migrations(tables: Mapping[str, str]) -> list[tuple[int, list[tuple[str, str]]]]:
    """[(version, [(step name, SQL)])] from migrations/NNNN_*.sql, in version order."""
    out = []
    for entry in sorted(resources.files(__package__).joinpath("migrations").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = _load(f"migrations/{entry.name}", tables)
        steps = []
        for block in re.split(r"^-- step: ", text, flags=re.M)[1:]:
            name, _, body = block.partition("\n")
            sql = "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("--")).strip().rstrip(";")
            steps.append((name.strip(), sql))
        out.append((int(entry.name[:4]), steps))
    return out


def _utc(value: Any) -> Any:
    return value.replace(tzinfo=timezone.utc) if isinstance(value, datetime) and value.tzinfo is None else value


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


JOB_COLUMNS = ("id", "queue", "task", "args", "priority", "state", "attempts", "max_attempts", "run_at",
               "created_at", "started_at", "finished_at", "last_error", "errors", "result", "worker",
               "unique_key", "lease_expires_at")


def _job(row: Sequence[Any]) -> dict[str, Any]:
    job = dict(zip(JOB_COLUMNS, row))
    for key in ("args", "errors", "result"):
        if job[key] is not None:
            job[key] = json.loads(job[key])
    for key in ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at"):
        job[key] = _utc(job[key])
    job["id"], job["attempts"] = int(job["id"]), int(job["attempts"])
    return job


def _claimed(row: Sequence[Any]) -> ClaimedJob:
    return ClaimedJob(int(row[0]), row[1], row[2], json.loads(row[3]), int(row[4]), int(row[5]), int(row[6]),
                      _utc(row[7]), _utc(row[8]), _utc(row[9]))
