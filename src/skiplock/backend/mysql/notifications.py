"""Wake-ups without LISTEN/NOTIFY: the port's ``Notifications`` by adaptive polling of two O(1) reads.

MySQL and MariaDB have no LISTEN/NOTIFY. What a listener needs to know is "a job was enqueued"
(idle workers) and "job N finished" (its waiters). Both become visible at a COMMIT as new rows:

- an enqueue commits jobs rows: ``MAX(id)`` of the jobs table grows (InnoDB answers it from the end
  of the primary key: "Select tables optimized away", one index dive) -- so an enqueue writes
  nothing extra for its wake-up;
- a finishing write of a job someone waits on inserts a row into ``<schema>_notices`` in its own
  transaction (queries.sql: ``notify``), visible exactly when that write commits.

One statement (``poll`` in queries.sql) reads both. ``wait(timeout)`` polls until something new
arrives or ``timeout`` passes. Between empty polls it sleeps an interval that starts at
``min_interval`` after anything arrived and grows by 1.5 per empty poll up to ``max_interval``.
Busy, a listener wakes within a few ms; idle, it costs ``1 / max_interval`` queries per second
(docs/mysql.md: 10 q/s at the default 0.1 s). Like NOTIFY on PostgreSQL, this is a hint and never
the source of truth: slots still poll, and an auto-increment id committed out of order (a lower id
committing after a higher one was seen) is caught for notices by re-reading the last two seconds'
rows (deduplicated), and for enqueues by the slots' own polling.

The outbox relays use the same class on their own ``poll`` (outbox.sql): a put commits outbox rows,
so MAX(outbox.id) grows and the relays wake; a put writes nothing extra for it.

A dead session raises :class:`~skiplock.errors.ConnectionLost`; only skiplock errors leave.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

import pymysql

from .errors import translate

if TYPE_CHECKING:
    from .connections import MySQLConnections

MIN_INTERVAL = 0.005
MAX_INTERVAL = 0.1
GROWTH = 1.5


class MySQLNotifications:
    """The notices and enqueues of one autocommit session, as payloads (see the module doc)."""

    def __init__(self, conn: Any, backend: "MySQLConnections", *, min_interval: float = MIN_INTERVAL,
                 max_interval: float = MAX_INTERVAL, queries: Mapping[str, str] | None = None,
                 wake_payload: str | None = None):
        """``queries``/``wake_payload``: whose ``poll`` statement to run and the payload a grown
        MAX(id) gives -- the job queue's by default; the outbox relays' (outbox.py) poll the outbox."""
        self._conn = conn
        self._dsn = backend.dsn
        self._q = backend.q if queries is None else queries
        self._wake = backend.wake_payload if wake_payload is None else wake_payload
        self.min_interval = min_interval
        self.max_interval = max_interval
        self._interval = min_interval
        self._next_poll = 0.0  # time.monotonic() of the next poll
        self.polls = 0  # statements run (the idle cost, measured by bench/mysql_wakeup.py)
        self._last_job, self._last_notice = self._read(None)[:2]
        self._seen: dict[int, None] = {}  # notice ids read within the re-read window

    def _read(self, after: int | None) -> tuple[int, int, list[tuple[int, str]]]:
        """(MAX(jobs.id), MAX(notices.id), [(id, payload) of notices after ``after`` or recent])."""
        self.polls += 1
        try:
            with self._conn.cursor() as cur:
                cur.execute(self._q["poll"], {"after": -1 if after is None else after,
                                              "want": 0 if after is None else 1})
                rows = cur.fetchall()
        except pymysql.err.MySQLError as exc:
            raise translate(exc, self._dsn) from None
        last_job, last_notice = int(rows[0][0] or 0), int(rows[0][1] or 0)
        return last_job, last_notice, [(int(r[0]), r[1]) for r in rows[1:]]

    def wait(self, timeout: float) -> list[str]:
        """Payloads as soon as a poll finds any, else ``[]`` after ``timeout``. Polls are spaced by the
        interval whatever the calls' boundaries (``_next_poll``), so the idle cost is 1 / max_interval."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            now = time.monotonic()
            if now >= self._next_poll:
                payloads = self._poll()
                if payloads:
                    self._interval = self.min_interval
                    self._next_poll = time.monotonic() + self._interval
                    return payloads
                self._interval = min(self.max_interval, self._interval * GROWTH)
                self._next_poll = now + self._interval
            if now >= deadline:
                return []
            time.sleep(max(0.0, min(self._next_poll, deadline) - now))

    def _poll(self) -> list[str]:
        last_job, last_notice, notices = self._read(self._last_notice)
        payloads: list[str] = []
        if last_job > self._last_job:
            self._last_job = last_job
            payloads.append(self._wake)
        for notice_id, payload in notices:
            if notice_id not in self._seen:
                self._seen[notice_id] = None
                payloads.append(payload)
        self._last_notice = max(self._last_notice, last_notice)
        while len(self._seen) > 10_000:  # bounded: the oldest go first (dicts keep insertion order)
            del self._seen[next(iter(self._seen))]
        return payloads

    def close(self) -> None:
        try:
            self._conn.close()
        except pymysql.err.Error:
            pass

    @property
    def closed(self) -> bool:
        return not self._conn.open
