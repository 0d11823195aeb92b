"""The dashboard's backend verbs for PostgreSQL (a mixin :class:`PostgresBackend` inherits): the
filtered job list and its ids for bulk actions, the bounded queue summary, throughput per minute,
deleting finished jobs, and the audit log. Their SQL is the dashboard section at the end of queries.sql.

Every statement runs in a transaction of its own on a pooled connection with a local
``statement_timeout`` (:data:`STATEMENT_TIMEOUT_MS`, or the backend's ``dashboard_timeout_ms``): a
page never holds the server longer than that, whatever the table's size; the server's error then
reaches the caller as :class:`~skiplock.errors.DatabaseError`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import psycopg
from psycopg.rows import dict_row

from .errors import translate
from .queries import identifier_text

# A dashboard statement is ended by the server past this many milliseconds.
STATEMENT_TIMEOUT_MS = 5000

# The queue summary's estimate reads about this many of the jobs table's pages (TABLESAMPLE SYSTEM).
SAMPLE_PAGES = 300

FILTER_KEYS = ("state", "queue", "task", "error_class", "since", "until", "args")


def _filter_params(flt: Mapping[str, Any], before: int | None, limit: int) -> dict[str, Any]:
    params = {key: flt.get(key) for key in FILTER_KEYS}
    params.update(before=before, limit=limit, id_floor=flt.get("id_floor"))
    return params


class PostgresReads:
    """The dashboard's verbs (see the module docstring). Needs the backend's ``_conn`` and ``q``."""

    dashboard_timeout_ms: int = STATEMENT_TIMEOUT_MS
    q: dict[str, str]
    dsn: str
    schema: str

    def _conn(self) -> Any:  # PostgresBackend's
        raise NotImplementedError

    def _bounded(self, name: str, params: Mapping[str, Any], *, dicts: bool = False) -> list[Any]:
        """Run one named statement in a transaction with the dashboard's statement timeout."""
        try:
            with self._conn() as conn, conn.transaction():
                conn.execute(self.q["dash_timeout"], {"ms": str(int(self.dashboard_timeout_ms))})
                cur = conn.cursor(row_factory=dict_row) if dicts else conn.cursor()
                cur.execute(self.q[name], params)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    def summary_preamble(self, conn: Any) -> None:
        """What the queue summary's transaction sends before its statements: the dashboard's timeout,
        and index walks only (queries.sql, ``dash_walk_indexes``)."""
        conn.execute(self.q["dash_timeout"], {"ms": str(int(self.dashboard_timeout_ms))})
        conn.execute(self.q["dash_walk_indexes"])

    def find_jobs(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[dict[str, Any]]:
        """Jobs matching ``flt`` (keys of FILTER_KEYS, None: any), newest first, ids below ``before``."""
        return self._bounded("dash_find_jobs", _filter_params(flt, before, limit), dicts=True)

    def id_floor(self, before: int | None, window: int) -> int:
        """Where a search of ``window`` ids below ``before`` (None: from the newest job) stops (below 1:
        it reaches the first job). ``find_jobs`` reads only ids >= a filter's ``id_floor``."""
        return int(self._bounded("dash_id_floor", {"before": before, "window": int(window)})[0][0])

    def matching_job_ids(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[int]:
        """The ids of the jobs ``find_jobs`` would list, newest first, below ``before``, at most ``limit``."""
        return [int(r[0]) for r in self._bounded("dash_matching_ids", _filter_params(flt, before, limit))]

    def queue_summary(self, cap: int) -> dict[str, list[tuple[Any, ...]]]:
        """The dashboard's per-queue figures, bounded at any table size (queries.sql, "the dashboard's
        queue summary"), in one transaction: ``counts`` (queue, state, n) with n exact up to ``cap``
        (above it: more than ``cap``); ``heads`` (queue, ready -- exact up to ``cap`` --, head_run_at,
        head_age, paused); ``estimates`` (queue, state, estimate) from a sample of about
        :data:`SAMPLE_PAGES` pages, read only when a count passed ``cap``."""
        params = {"cap": int(cap)}
        try:
            with self._conn() as conn, conn.transaction():
                self.summary_preamble(conn)
                counts = [tuple(r) for r in conn.execute(self.q["dash_state_counts"], params).fetchall()]
                heads = [tuple(r) for r in conn.execute(self.q["dash_queue_heads"], params).fetchall()]
                estimates: list[tuple[Any, ...]] = []
                if any(r[2] > cap for r in counts):
                    table = identifier_text(self.schema, "jobs")  # a regclass's text, passed as a parameter
                    row = conn.execute(self.q["dash_relation_pages"], {"table": table}).fetchone()
                    pages = int(row[0]) if row and row[0] else 0
                    percent = 100.0 if pages <= SAMPLE_PAGES else 100.0 * SAMPLE_PAGES / pages
                    estimates = [tuple(r) for r in conn.execute(self.q["dash_count_sample"],
                                                                {"percent": percent}).fetchall()]
                return {"counts": counts, "heads": heads, "estimates": estimates}
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    def throughput(self, seconds: float) -> list[tuple[datetime, int, int, int]]:
        """(minute, done, failed, cancelled) of the jobs finished in the last ``seconds``."""
        return [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in
                self._bounded("dash_throughput", {"seconds": float(seconds)})]

    def pickup_latency(self, seconds: float) -> tuple[float | None, float | None, float | None, int]:
        """(median, p95, max, jobs): seconds from due to started of the jobs finished in the last ``seconds``."""
        row = self._bounded("dash_pickup_latency", {"seconds": float(seconds)})[0]
        return (None if row[0] is None else float(row[0]), None if row[1] is None else float(row[1]),
                None if row[2] is None else float(row[2]), int(row[3]))

    def delete_finished_jobs(self, ids: Sequence[int]) -> list[int]:
        """Delete those of ``ids`` that are finished and not locked; returns the ids deleted."""
        return [int(r[0]) for r in self._bounded("dash_delete_finished", {"ids": list(ids)})]

    def audit_write(self, actor: str, action: str, target: Mapping[str, Any], affected: int) -> int:
        rows = self._bounded("dash_audit_write", {"actor": actor, "action": action,
                                                  "target": json.dumps(dict(target), default=str),
                                                  "affected": int(affected)})
        return int(rows[0][0])

    def audit_rows(self, before: int | None, limit: int) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._bounded("dash_audit_rows", {"before": before, "limit": limit})]


