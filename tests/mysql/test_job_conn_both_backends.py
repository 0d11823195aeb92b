"""``job.conn`` is the driver's connection on both backends, and one handler written against the
DB-API -- ``cur = job.conn.cursor(); cur.execute("insert … values (%s, %s)", (a, b))`` -- runs
unchanged on PostgreSQL (psycopg) and on MariaDB (PyMySQL) (issue 12, item 6). Its writes commit
with the job: a run that fails after writing leaves nothing (its write rolls back with the
attempt), the run that succeeds leaves exactly one row per job."""

from __future__ import annotations

from typing import Any, Callable

import psycopg
import pytest

import skiplock


@pytest.fixture(params=["postgresql", "mariadb"])
def backend(request: pytest.FixtureRequest) -> tuple[str, Callable[[str], list[tuple[Any, ...]]]]:
    """(a DSN of a fresh database with the table ``conn_effects``, a function running a query there)."""
    if request.param == "postgresql":
        dsn = request.getfixturevalue("dsn")

        def query(text: str) -> list[tuple[Any, ...]]:
            with psycopg.connect(dsn, autocommit=True) as c:
                cur = c.execute(text)  # type: ignore[arg-type]
                return [tuple(r) for r in cur.fetchall()] if cur.description else []
    else:
        dsn = request.getfixturevalue("mariadb_dsn")
        server = request.getfixturevalue("mariadb_server")
        database = dsn.rsplit("/", 1)[1]
        dsn = "mariadb://" + dsn[len("mysql://"):]

        def query(text: str) -> list[tuple[Any, ...]]:
            with server.connect(database) as c, c.cursor() as cur:
                cur.execute(text)
                return [tuple(r) for r in cur.fetchall()]
    query("CREATE TABLE conn_effects (job_id BIGINT NOT NULL, attempt INT NOT NULL, note VARCHAR(50) NOT NULL)")
    return dsn, query


def test_one_dbapi_handler_runs_on_both_backends_its_writes_commit_with_the_job(backend: Any) -> None:
    dsn, query = backend
    app = skiplock.App(dsn)
    app.migrate()
    seen: list[str] = []

    @app.task(name="conn.write", max_attempts=2, retry=0)
    def write(job: Any, note: str) -> str:
        cur = job.conn.cursor()  # the driver's own cursor: %s placeholders on psycopg and PyMySQL alike
        cur.execute("insert into conn_effects (job_id, attempt, note) values (%s, %s, %s)",
                    (job.id, job.attempt, note))
        seen.append(type(job.conn).__module__.split(".")[0])
        if note == "fails once" and job.attempt == 1:
            raise RuntimeError("after the write: the attempt rolls back, the write with it")
        return note

    ids = [app.enqueue("conn.write", {"note": n}) for n in ("plain", "fails once", "plain too")]
    try:
        app.worker(concurrency=2, poll_interval=0.05).run(stop_when_empty=True)
        jobs = [app.get_job(i) for i in ids]
    finally:
        app.close()
    assert [j.state for j in jobs] == ["done", "done", "done"]
    assert set(seen) == ({"psycopg"} if dsn.startswith("postgresql") or "://" not in dsn else {"pymysql"})
    assert sorted(query("SELECT job_id, attempt, note FROM conn_effects")) == sorted(
        [(ids[0], 1, "plain"), (ids[1], 2, "fails once"), (ids[2], 1, "plain too")])
