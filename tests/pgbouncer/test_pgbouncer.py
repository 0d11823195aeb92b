"""skiplock behind a real PgBouncer (tests/pgbouncer_server.py), in transaction pooling mode and in
session mode (``pooling``): what a pooler changes and what skiplock does about it (issue 15 item 4;
docs/deployment.md, "PgBouncer and poolers").

- A stock PgBouncer refuses the ``options`` startup parameter, which carries skiplock's session
  settings on a direct connection: behind a pooler they are sent another way (per transaction, with
  ``SET LOCAL``), so every connection works.
- A transaction pooler hands each transaction to any server session: no prepared statements, the lease
  bounds set per transaction, the lease's backend pid read per transaction, and no LISTEN through it
  (notifications would be silently lost): LISTEN goes to ``direct_dsn`` when given, else idle workers
  poll, and a WARNING says so.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

import skiplock
from support import wait_for


def test_an_app_behind_pgbouncer_enqueues_and_drains_both_lease_modes(dsn: str, db: psycopg.Connection,
                                                                       pooling: str) -> None:
    db.execute("CREATE TABLE effects (job_id bigint PRIMARY KEY, pid int NOT NULL)")
    app = skiplock.App(dsn)

    @app.task(name="txn")
    def txn(job: skiplock.Job) -> None:
        job.conn.execute("INSERT INTO effects VALUES (%s, pg_backend_pid())", [job.id])

    @app.task(name="claimed", lease="claimed", lease_seconds=5)
    def claimed(job: skiplock.Job) -> None:
        job.conn.execute("INSERT INTO effects VALUES (%s, pg_backend_pid())", [job.id])

    try:
        ids = app.enqueue_many([("txn", {})] * 30 + [("claimed", {})] * 30)
        stats = app.worker(concurrency=4).run(stop_when_empty=True)
        assert stats.done == 60, stats
        assert db.execute("SELECT count(*) FROM effects").fetchone()[0] == 60
        assert {app.get_job(i).state for i in ids} == {"done"}
    finally:
        app.close()
