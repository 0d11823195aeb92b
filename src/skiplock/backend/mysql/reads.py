"""The dashboard's backend verbs on MySQL/MariaDB (a mixin :class:`MySQLBackend` inherits), as
PostgreSQL's reads.py: the filtered job list and its ids for bulk actions (keyset on id, never OFFSET),
the bounded queue summary, throughput and queue latency, deleting finished jobs. Their SQL is the dashboard section of queries.sql; the
audit log's verbs are operating.py's.

Every statement runs on a pooled connection with the dashboard's statement time limit set on its
session for that statement and put back to the server's default after it (the connection returns to
the pool as it was): MariaDB's ``max_statement_time`` (every statement), or MySQL 8's
``max_execution_time`` (SELECTs only: there the bulk delete is bounded by its id list, at most a bulk
page, and by the short ``innodb_lock_wait_timeout`` -- it never waits on a lock anyway, SKIP LOCKED).
Past the limit the server ends the statement and the caller gets :class:`~skiplock.errors.DatabaseError`.
A page never holds the server longer than :data:`STATEMENT_TIMEOUT_MS`, whatever the table's size."""

from __future__ import annotations

import math
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Iterator, Mapping, Sequence

from .sql import _naive_utc, _utc

# A dashboard statement is ended by the server past this many milliseconds (as on PostgreSQL).
STATEMENT_TIMEOUT_MS = 5000

FILTER_KEYS = ("state", "queue", "task", "error_class", "since", "until", "args")
ROW_KEYS = ("id", "queue", "task", "state", "priority", "attempts", "max_attempts", "run_at", "created_at",
            "started_at", "finished_at", "last_error", "worker")


def _filter_params(flt: Mapping[str, Any], before: int | None, limit: int) -> dict[str, Any]:
    params: dict[str, Any] = {key: flt.get(key) for key in FILTER_KEYS}
    params["since"], params["until"] = _naive_utc(params["since"]), _naive_utc(params["until"])
    params.update(before=before, limit=int(limit), id_floor=flt.get("id_floor"))
    return params


class MySQLReads:
    """The dashboard's verbs (see the module docstring). Needs the backend's ``_conn``,
    ``_transaction`` and ``q`` (connections.py)."""

    dashboard_timeout_ms: int = STATEMENT_TIMEOUT_MS
    q: dict[str, str]
    _time_limit: str | None = None  # "mariadb" or "mysql": which variable the server has ("": neither)

    def _conn(self) -> Any:  # MySQLConnections'
        raise NotImplementedError

    def _transaction(self) -> Any:  # MySQLConnections'
        raise NotImplementedError

    def _limit_kind(self, cur: Any) -> str:
        if self._time_limit is None:
            cur.execute(self.q["dash_timeout_variable"])
            names = {str(r[0]).lower() for r in cur.fetchall()}
            self._time_limit = ("mariadb" if "max_statement_time" in names
                                else "mysql" if "max_execution_time" in names else "")
        return self._time_limit

    @contextmanager
    def _time_limited(self, cur: Any) -> Iterator[None]:
        """The session's statements within: ended by the server past ``dashboard_timeout_ms``."""
        kind = self._limit_kind(cur)
        if kind == "mariadb":
            cur.execute(self.q["dash_timeout_mariadb"], {"seconds": self.dashboard_timeout_ms / 1000.0})
        elif kind == "mysql":
            cur.execute(self.q["dash_timeout_mysql"], {"ms": int(self.dashboard_timeout_ms)})
        try:
            yield
        finally:
            if kind:  # a lost session is discarded by _conn; a live one goes back to the pool as it was
                try:
                    cur.execute(self.q[f"dash_timeout_{kind}_reset"])
                except Exception:  # noqa: BLE001 - the statement's own error is the one to raise
                    try:  # never pooled with the limit still set: closed, so _conn discards it
                        cur.connection.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _bounded(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run one named statement under the dashboard's statement time limit; its rows."""
        with self._conn() as c, c.cursor() as cur:
            with self._time_limited(cur):
                cur.execute(self.q[name], dict(params))
                rows = cur.fetchall() if cur.description else ()
        return [tuple(_utc(v) for v in r) for r in rows]

    def find_jobs(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[dict[str, Any]]:
        """Jobs matching ``flt`` (keys of FILTER_KEYS, None: any), newest first, ids below ``before``."""
        out = []
        for r in self._bounded("dash_find_jobs", _filter_params(flt, before, limit)):
            row = dict(zip(ROW_KEYS, r))
            for key in ("id", "priority", "attempts", "max_attempts"):
                row[key] = int(row[key])
            out.append(row)
        return out

    def id_floor(self, before: int | None, window: int) -> int:
        """Where a search of ``window`` ids below ``before`` (None: from the newest job) stops (below 1:
        it reaches the first job). ``find_jobs`` reads only ids >= a filter's ``id_floor``."""
        return int(self._bounded("dash_id_floor", {"before": before, "window": int(window)})[0][0])

    def matching_job_ids(self, flt: Mapping[str, Any], before: int | None, limit: int) -> list[int]:
        """The ids of the jobs ``find_jobs`` would list, newest first, below ``before``, at most ``limit``:
        the very same statement (``dash_find_jobs``: one WHERE, one scan), its first column."""
        return [int(r[0]) for r in self._bounded("dash_find_jobs", _filter_params(flt, before, limit))]

    def queue_summary(self, cap: int) -> dict[str, list[tuple[Any, ...]]]:
        """The dashboard's per-queue figures, bounded at any table size (queries.sql, "the dashboard's
        queue summary"), as PostgreSQL's: ``counts`` (queue, state, n) with n exact up to ``cap`` (above
        it: more than ``cap``); ``heads`` (queue, ready -- exact up to ``cap`` --, head_run_at,
        head_age, paused) for every queue with queued jobs or paused; ``estimates`` (queue, state,
        estimate) from the optimiser's index dive, only for the counts that passed ``cap``. At most
        (pairs x (cap + 1 + jobs in flight)) + (queues x (cap + 1)) index entries are read."""
        cap = int(cap)
        with self._conn() as c, c.cursor() as cur, self._time_limited(cur):
            pairs = sorted(self._pairs(cur))
            cur.execute(self.q["dash_in_flight"])
            flight = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
            counts: dict[tuple[str, str], int] = {}
            for queue, state in pairs:
                limit = cap + 1 + (len(flight) if state == "queued" else 0)
                cur.execute(self.q["dash_pair_count"], {"state": state, "queue": queue, "cap": limit})
                counts[(queue, state)] = int(cur.fetchone()[0])
            for queue, _ in flight:  # a transaction-lease job in flight: its row says queued, it runs
                counts[(queue, "queued")] = counts.get((queue, "queued"), 0) - 1
                counts[(queue, "running")] = counts.get((queue, "running"), 0) + 1
            estimates: list[tuple[Any, ...]] = []
            for (queue, state), n in sorted(counts.items()):
                if n > cap:
                    cur.execute(self.q["dash_pair_estimate"], {"state": state, "queue": queue})
                    column = [d[0].lower() for d in cur.description].index("rows")
                    estimates.append((queue, state, max(int(r[column] or 0) for r in cur.fetchall())))
            cur.execute(self.q["paused_queues"])
            paused = {str(r[0]) for r in cur.fetchall()}
            in_flight = [job_id for _, job_id in flight] or [0]  # NOT IN () is no SQL; ids start at 1
            heads: list[tuple[Any, ...]] = []
            for queue in sorted({q for q, s in pairs if s == "queued"} | paused):
                params = {"queue": queue, "in_flight": in_flight, "cap": cap + 1}
                cur.execute(self.q["dash_ready_count"], params)
                ready = int(cur.fetchone()[0])
                cur.execute(self.q["dash_queue_head"], params)
                head = cur.fetchone()
                heads.append((queue, ready, None if head is None else _utc(head[0]),
                              None if head is None else timedelta(microseconds=int(head[1])), queue in paused))
        return {"counts": [(q, s, n) for (q, s), n in sorted(counts.items()) if n > 0], "heads": heads,
                "estimates": estimates}

    def _pairs(self, cur: Any) -> list[tuple[str, str]]:
        """(queue, state) of every pair that has jobs: the loose index scan, one probe per pair."""
        cur.execute(self.q["dash_queue_pairs"])
        return [(str(r[0]), str(r[1])) for r in cur.fetchall()]

    def throughput(self, seconds: float) -> list[tuple[datetime, int, int, int]]:
        """(minute, done, failed, cancelled) of the jobs finished in the last ``seconds``."""
        return [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in
                self._bounded("dash_throughput", {"seconds_us": int(float(seconds) * 1_000_000)})]

    def pickup_latency(self, seconds: float) -> tuple[float | None, float | None, float | None, int]:
        """(median, p95, max, jobs): seconds from due to started of the jobs finished in the last
        ``seconds`` (percentiles interpolated as PostgreSQL's percentile_cont)."""
        rows = self._bounded("dash_pickup_latency", {"seconds_us": int(float(seconds) * 1_000_000)})
        if not rows:
            return None, None, None, 0
        at = {int(i): float(w) for i, _, w in rows}
        n = int(rows[0][1])

        def percentile(p: float) -> float:
            position = (n - 1) * p
            low, high = math.floor(position), math.ceil(position)
            return at[low] + (at[high] - at[low]) * (position - low)

        return percentile(0.5), percentile(0.95), at[n - 1], n

    def delete_finished_jobs(self, ids: Sequence[int]) -> list[int]:
        """Delete those of ``ids`` that are finished and not locked by another transaction (skipped,
        never waited on); returns the ids deleted. One transaction: lock them, then delete each and its
        attempt row by primary key."""
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return []
        with self._transaction() as c, c.cursor() as cur:
            with self._time_limited(cur):
                cur.execute(self.q["dash_lock_finished"], {"ids": wanted})
                locked = [int(r[0]) for r in cur.fetchall()]
                for job_id in locked:  # by primary key, one at a time (see dash_delete_finished)
                    cur.execute(self.q["dash_delete_finished"], {"id": job_id})
                    cur.execute(self.q["dash_delete_attempts"], {"id": job_id})
        return locked
