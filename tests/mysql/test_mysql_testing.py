"""skiplock.testing on MariaDB (backend.testing(): rolled-back connections, run_inline's and
assert_enqueued's statements): the same helpers as on PostgreSQL, nothing left behind."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest

import skiplock
from skiplock import testing


def test_run_inline_and_assert_enqueued_in_a_rolled_back_transaction(mariadb_dsn: str, mariadb_server: Any) -> None:
    app = skiplock.App(mariadb_dsn)
    app.migrate()
    database = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE effects (job_id BIGINT NOT NULL) ENGINE=InnoDB")

    @app.task(name="effect")
    def effect(job: Any, n: int) -> int:
        cur = job.conn.cursor()
        cur.execute("insert into effects (job_id) values (%s)", (job.id,))
        return n * 2

    @app.task(name="boom")
    def boom(job: Any) -> None:
        job.conn.cursor().execute("insert into effects (job_id) values (%s)", (job.id,))
        raise ValueError("no")

    try:
        with testing.rolled_back(app) as conn:
            assert testing.run_inline(app, "effect", {"n": 21}, conn=conn) == 42
            (done,) = testing.assert_enqueued(app, task="effect", state="done", conn=conn)
            assert (done.attempts, done.result) == (1, 42)
            with pytest.raises(ValueError):
                testing.run_inline(app, "boom", conn=conn)
            testing.assert_enqueued(app, task="boom", count=1, conn=conn)  # still queued, its write undone
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM effects")
                assert cur.fetchone() == (1,)
            with pytest.raises(pymysql.err.ProgrammingError):
                conn.commit()
        assert app.list_jobs(limit=10) == []  # nothing escaped the rollback
        with mariadb_server.connect(database) as c, c.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM effects")
            assert cur.fetchone() == (0,)
    finally:
        app.close()
