"""The real worker on MariaDB (issue 12): nothing above the seam changed for it. 200 jobs drained by
``app.worker(...).run(stop_when_empty=True)``: every job done once, and each handler's write through
``job.conn`` (a DB-API cursor, ``%s`` placeholders) committed with its job -- exactly one row per job."""

from __future__ import annotations

from typing import Any

import skiplock


def test_a_worker_drains_200_jobs_each_write_once_with_its_job(mariadb_dsn: str, mariadb_server: Any) -> None:
    app = skiplock.App(mariadb_dsn)
    app.migrate()
    database = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE effects (job_id BIGINT NOT NULL, n INT NOT NULL) ENGINE=InnoDB")

    @app.task(name="effect")
    def effect(job: Any, n: int) -> None:
        cur = job.conn.cursor()
        cur.execute("insert into effects (job_id, n) values (%s, %s)", (job.id, n))

    ids = [app.enqueue("effect", {"n": i}) for i in range(200)]
    try:
        app.worker(concurrency=4, poll_interval=0.05).run(stop_when_empty=True)
        states = {app.get_job(i).state for i in ids}
    finally:
        app.close()
    assert states == {"done"}
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("SELECT job_id, COUNT(*) FROM effects GROUP BY job_id HAVING COUNT(*) <> 1")
        assert cur.fetchall() == ()
        cur.execute("SELECT COUNT(*), COUNT(DISTINCT job_id), SUM(n) FROM effects")
        assert cur.fetchone() == (200, 200, sum(range(200)))


def test_a_killed_lease_session_returns_its_job_to_the_worker(mariadb_dsn: str, mariadb_server: Any) -> None:
    """KILL of the lease session mid-job (an operator, a crash of the connection): the attempt rolls
    back with everything the handler wrote, the job is queued again and runs to done; its effect
    exists once, from the run that committed."""
    import threading

    from support import wait_for

    app = skiplock.App(mariadb_dsn)
    app.migrate()
    database = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE effects (job_id BIGINT NOT NULL, session BIGINT NOT NULL) ENGINE=InnoDB")
    sessions: list[int] = []
    release = threading.Event()

    @app.task(name="slow", max_attempts=3)
    def slow(job: Any) -> None:
        cur = job.conn.cursor()
        cur.execute("insert into effects (job_id, session) values (%s, %s)", (job.id, job.conn.thread_id()))
        sessions.append(job.conn.thread_id())
        if len(sessions) == 1:
            release.wait(30)  # the first run is killed meanwhile

    job_id = app.enqueue("slow", {})
    worker = app.worker(concurrency=1, poll_interval=0.05)
    runner = threading.Thread(target=lambda: worker.run(stop_when_empty=True), daemon=True)
    runner.start()
    try:
        wait_for(lambda: sessions, what="the first run to start")
        with mariadb_server.connect() as admin, admin.cursor() as cur:
            cur.execute("KILL CONNECTION %s", (sessions[0],))
        release.set()
        runner.join(60)
        assert not runner.is_alive()
        job = app.get_job(job_id)
    finally:
        release.set()
        app.close()
    assert job.state == "done" and len(sessions) == 2 and sessions[1] != sessions[0]
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("SELECT session FROM effects WHERE job_id = %s", (job_id,))
        assert cur.fetchall() == ((sessions[1],),)


def test_a_handler_hung_past_its_timeout_has_its_lease_ended_by_the_watchdog(mariadb_dsn: str,
                                                                              mariadb_server: Any) -> None:
    """issue 12 item 3: MySQL cannot bound a lease on the server, so the worker's watchdog KILLs the
    session of a lease held past the task's timeout: the handler's write rolls back, the attempt is
    recorded failed (JobTimeout). The handler measures the bound itself (its start to its
    session gone from PROCESSLIST), reported in docs/mysql.md -- printed, never asserted."""
    import time

    app = skiplock.App(mariadb_dsn)
    app.migrate()
    database = mariadb_dsn.rsplit("/", 1)[1]
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("CREATE TABLE effects (job_id BIGINT NOT NULL) ENGINE=InnoDB")
    bounds: list[float] = []

    @app.task(name="hung", timeout=1.0, max_attempts=1)
    def hung(job: Any) -> None:
        started = time.monotonic()
        session = job.conn.thread_id()
        cur = job.conn.cursor()
        cur.execute("insert into effects (job_id) values (%s)", (job.id,))
        with mariadb_server.connect() as admin, admin.cursor() as acur:
            while time.monotonic() - started < 30:  # a safety net, not a speed assertion
                acur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (session,))
                if acur.fetchone()[0] == 0:
                    bounds.append(time.monotonic() - started)
                    return
                time.sleep(0.01)

    job_id = app.enqueue("hung", {})
    try:
        app.worker(concurrency=1, poll_interval=0.05).run(stop_when_empty=True)
        job = app.get_job(job_id)
    finally:
        app.close()
    assert bounds, "the watchdog never ended the hung handler's lease"
    print(f"watchdog bound on a 1 s task timeout: the lease session was gone {bounds[0]:.3f} s after the handler started")
    assert job.state == "failed" and (job.last_error or "").startswith("JobTimeout"), job
    with mariadb_server.connect(database) as c, c.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM effects")
        assert cur.fetchone() == (0,)  # the handler's write went with its lease


def test_claimed_lease_jobs_drain_to_done(mariadb_dsn: str) -> None:
    """The claimed lease on MariaDB through the real worker: each job's row goes running with an
    owner and a lease, the handler runs outside any transaction, the fenced done is written."""
    app = skiplock.App(mariadb_dsn)
    app.migrate()
    ran: list[int] = []

    @app.task(name="claimed", lease="claimed")
    def claimed(job: Any) -> None:
        ran.append(job.id)

    ids = [app.enqueue("claimed", {}) for _ in range(20)]
    try:
        app.worker(concurrency=2, poll_interval=0.05).run(stop_when_empty=True)
        jobs = [app.get_job(i) for i in ids]
    finally:
        app.close()
    assert {j.state for j in jobs} == {"done"} and sorted(ran) == ids
    assert {j.attempts for j in jobs} == {1}


def test_enqueue_many_with_unique_keys_on_mariadb(mariadb_dsn: str) -> None:
    """App.enqueue_many with unique keys on MySQL (keyed_batch / enqueue_keyed): a held key gives the
    holder's id, an in-call duplicate the first item's; with on_conflict="raise" meeting a holder,
    DuplicateJob and nothing of the call is enqueued."""
    import pytest

    from skiplock.errors import DuplicateJob

    app = skiplock.App(mariadb_dsn)
    app.migrate()
    try:
        held = app.enqueue("t", unique_key="a")
        ids = app.enqueue_many([("t", {}, {"unique_key": "a"}), ("t", {}), ("t", {}, {"unique_key": "b"}),
                                ("t", {}, {"unique_key": "b"})])
        assert ids[0] == held and ids[3] == ids[2] and len(set(ids)) == 3
        before = app.counts()
        with pytest.raises(DuplicateJob) as refused:
            app.enqueue_many([("t", {}, {"unique_key": "c"}), ("t", {}, {"unique_key": "a", "on_conflict": "raise"})])
        assert refused.value.existing_id == held
        assert app.counts() == before  # "c" went with the refusal
    finally:
        app.close()


def test_near_instant_jobs_drain_in_batches(mariadb_dsn: str) -> None:
    """Batched claims on MariaDB through the real worker (capabilities.batched_claims): no-op jobs
    are claimed many per transaction and written done by complete_batch with its COMMIT; every job
    ends done with one attempt, and no batch row outlives its transaction."""
    from skiplock.backend.mysql import MySQLBackend

    app = skiplock.App(mariadb_dsn)
    app.migrate()

    @app.task(name="noop")
    def noop(job: Any) -> None:
        return None

    ids = app.enqueue_many([("noop", {}) for _ in range(300)])
    try:
        stats = app.worker(concurrency=2, poll_interval=0.05, batch_size=50).run(stop_when_empty=True)
        jobs = [app.get_job(i) for i in ids]
    finally:
        app.close()
    assert {j.state for j in jobs} == {"done"} and {j.attempts for j in jobs} == {1}
    assert stats.done == 300
    b = MySQLBackend(mariadb_dsn)
    try:
        with b._conn() as c, c.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {b.tables['job_batches']}")
            assert cur.fetchone() == (0,)
            cur.execute("SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                        "AND TABLE_NAME = %s", (f"{b.schema}_job_batches",))
            assert cur.fetchone()[0] > 1  # batches were started (their rows went with their COMMITs)
            cur.execute(f"SELECT COUNT(*) FROM {b.tables['job_attempts']}")
            assert cur.fetchone() == (0,)
    finally:
        b.close()
