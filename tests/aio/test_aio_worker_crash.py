"""A SIGKILLed asyncio worker process: its transaction-lease jobs are back at once (the server rolls
their sessions back, with the writes made through job.conn); its claimed-lease jobs come back at
rescue, once their leases, no longer renewed, expire."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import skiplock
from support import wait_for

pytestmark = pytest.mark.timeout(60)

WORKER = textwrap.dedent("""
    import asyncio, sys
    import skiplock

    aapp = skiplock.AsyncApp(sys.argv[1])

    @aapp.task(name="hang", lease=sys.argv[2], lease_seconds=1)
    async def hang(job):
        if job.conn is not None:
            await job.conn.execute("INSERT INTO effects VALUES (%s)", [job.id])
        print("started", job.id, flush=True)
        await asyncio.sleep(60)

    asyncio.run(aapp.run_async_worker(concurrency=8, max_connections=6))
""")

N = 3


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_a_killed_async_worker_s_jobs_come_back(dsn, db, tmp_path, lease):
    db.execute("CREATE TABLE effects (job bigint)")
    app = skiplock.App(dsn)
    app.migrate()
    ids = app.enqueue_many([("hang", {}) for _ in range(N)])
    script = tmp_path / "aio_worker_script.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), dsn, lease], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        started = [proc.stdout.readline() for _ in range(N)]  # type: ignore[union-attr]
        assert all(line.startswith("started") for line in started), started
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]

    def claimable() -> bool:
        return db.execute("SELECT count(*) FROM (SELECT id FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'queued' "
                          "FOR UPDATE SKIP LOCKED) t", [ids]).fetchone()[0] == N

    if lease == "transaction":
        wait_for(claimable, what="the killed worker's sessions ended and their jobs unlocked")
    else:
        assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'running'",
                          [ids]).fetchone()[0] == N
        rescued: list = []
        wait_for(lambda: rescued.extend(app.backend.rescue_expired()) or len(rescued) == N,
                 what="the expired leases rescued")
        assert claimable()
    assert db.execute("SELECT count(*) FROM effects").fetchone()[0] == 0  # rolled back with the lease

    aapp = skiplock.AsyncApp(app=app)

    @aapp.task(name="hang", lease=lease)
    async def finish(job):
        return "finished"

    stats = asyncio.run(asyncio.wait_for(aapp.run_async_worker(concurrency=4, max_connections=4,
                                                                stop_when_empty=True), 30))
    assert stats.done == N
    assert {app.get_job(i).state for i in ids} == {"done"}
    if lease == "claimed":
        assert all("lease expired" in app.get_job(i).errors[-1]["error"] for i in ids)
    app.close()


POISON = textwrap.dedent("""
    import asyncio, os, sys
    import skiplock

    aapp = skiplock.AsyncApp(sys.argv[1])

    @aapp.task(name="poison", max_attempts=1)
    async def poison(job):
        with open(sys.argv[2], "a") as f:
            f.write("run\\n")
        os._exit(3)  # takes its worker process down, every time

    @aapp.task(name="fine")
    async def fine(job):
        await asyncio.sleep(0.05)

    asyncio.run(aapp.run_async_worker(concurrency=8, max_connections=6, stop_when_empty=True))
""")


def test_a_job_that_kills_its_async_worker_every_time_ends_failed(dsn, tmp_path):
    """Each crash shares its process with other jobs, so it is not charged; but the job is then a
    suspect and its next attempt runs alone in its process, where a crash is its own: it ends failed
    within max_attempts + 1 runs, not retried for ever."""
    app = skiplock.App(dsn)
    app.migrate()
    poison = app.enqueue("poison", {}, max_attempts=1)
    app.enqueue_many([("fine", {}) for _ in range(6)])
    script, runs = tmp_path / "aio_poison_script.py", tmp_path / "runs"
    script.write_text(POISON)
    for _ in range(6):
        if app.get_job(poison).state == "failed":
            break
        subprocess.run([sys.executable, str(script), dsn, str(runs)], timeout=30, check=False)
        app.enqueue_many([("fine", {}) for _ in range(4)])  # neighbours in flight at the next crash too
    job = app.get_job(poison)
    assert job.state == "failed", (job.state, job.attempts, runs.read_text().count("run"))
    assert runs.read_text().count("run") <= 2  # max_attempts + 1
    app.close()
