"""The asyncio worker (worker/aio_worker.py) against the real server: job.conn is an AsyncConnection
whose writes commit with the job (transaction lease); claimed-lease jobs run many at once on a few
connections; sync handlers still work; timeouts, cancellation and fencing behave as in the sync worker."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

import skiplock

pytestmark = pytest.mark.timeout(60)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 45))  # a safety net, never a speed assertion


def test_transaction_lease_job_conn_is_async_and_its_writes_commit_with_the_job(dsn, db):
    db.execute("CREATE TABLE effects (tag text)")
    aapp = skiplock.AsyncApp(dsn)
    seen = []

    @aapp.task(name="write_ok")
    async def write_ok(job, tag):
        seen.append(type(job.conn))
        await job.conn.execute("INSERT INTO effects VALUES (%s)", [tag])
        await asyncio.sleep(0)
        return tag

    @aapp.task(name="write_then_fail", max_attempts=1)
    async def write_then_fail(job, tag):
        await job.conn.execute("INSERT INTO effects VALUES (%s)", [tag])
        raise RuntimeError("boom after writing")

    async def main():
        await aapp.migrate()
        ok = await aapp.enqueue("write_ok", {"tag": "kept"})
        bad = await aapp.enqueue("write_then_fail", {"tag": "rolled back"})
        stats = await aapp.run_async_worker(concurrency=4, max_connections=4, stop_when_empty=True)
        return ok, bad, stats

    ok, bad, stats = _run(main())
    assert seen and all(issubclass(t, psycopg.AsyncConnection) for t in seen)
    assert (stats.done, stats.failed) == (1, 1)
    assert aapp.app.get_job(ok).state == "done" and aapp.app.get_job(ok).result == "kept"
    failed = aapp.app.get_job(bad)
    assert failed.state == "failed" and "boom after writing" in failed.last_error
    assert [r[0] for r in db.execute("SELECT tag FROM effects")] == ["kept"]
    aapp.app.close()


def test_claimed_lease_jobs_run_many_at_once_holding_no_connection(dsn, db):
    n, connections = 60, 3
    aapp = skiplock.AsyncApp(dsn)
    in_flight = 0
    all_in = asyncio.Event()
    conns = []
    sessions = []

    @aapp.task(name="wait_for_all", lease="claimed", lease_seconds=30)
    async def wait_for_all(job, i):
        nonlocal in_flight
        conns.append(job.conn)
        in_flight += 1
        if in_flight == n:
            sessions.append(await asyncio.to_thread(lambda: db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-aio'").fetchone()[0]))
            all_in.set()
        await all_in.wait()  # every job is in flight at once before any finishes
        return i

    async def main():
        await aapp.migrate()
        await aapp.enqueue_many([("wait_for_all", {"i": i}) for i in range(n)])
        return await aapp.run_async_worker(concurrency=n, max_connections=connections, stop_when_empty=True)

    stats = _run(main())
    assert stats.done == n
    assert conns == [None] * n  # an in-flight claimed-lease job holds no connection
    assert 1 <= sessions[0] <= connections
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0] == n
    aapp.app.close()


def test_sync_handlers_run_in_a_thread_beside_async_ones(dsn, db):
    aapp = skiplock.AsyncApp(dsn)
    loop_threads = []

    @aapp.task(name="sync_one", lease="claimed")
    def sync_one(job, x):
        return threading.current_thread() is not loop_threads[0]

    @aapp.task(name="async_one")
    async def async_one(job, x):
        return threading.current_thread() is loop_threads[0]

    async def main():
        loop_threads.append(threading.current_thread())
        await aapp.migrate()
        a = await aapp.enqueue("sync_one", {"x": 1})
        b = await aapp.enqueue("async_one", {"x": 2})
        await aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True)
        return a, b

    a, b = _run(main())
    assert aapp.app.get_job(a).result is True and aapp.app.get_job(b).result is True
    aapp.app.close()


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_a_timeout_fails_the_attempt_and_is_retried_as_in_the_sync_worker(dsn, lease):
    aapp = skiplock.AsyncApp(dsn)
    attempts = []

    # 1 s, not less: a timeout that fires before the handler's first step (a loaded machine) is an
    # attempt that timed out without appending here -- the test counts the handler's runs
    @aapp.task(name="slow", lease=lease, timeout=1.0, max_attempts=2, retry=0)
    async def slow(job):
        attempts.append(job.attempts)
        await asyncio.sleep(30)

    async def main():
        await aapp.migrate()
        job_id = await aapp.enqueue("slow", {})
        stats = await aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True)
        return job_id, stats

    job_id, stats = _run(main())
    job = aapp.app.get_job(job_id)
    assert attempts == [1, 2] and (stats.retried, stats.failed) == (1, 1)
    assert job.state == "failed" and job.attempts == 2 and "JobTimeout" in job.last_error
    aapp.app.close()


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_cancelling_a_running_job_stops_it_and_records_it_cancelled(dsn, db, lease):
    db.execute("CREATE TABLE effects (tag text)")
    aapp = skiplock.AsyncApp(dsn)
    started = threading.Event()

    @aapp.task(name="forever", lease=lease, lease_seconds=1)
    async def forever(job):
        if job.conn is not None:
            await job.conn.execute("INSERT INTO effects VALUES ('never committed')")
        started.set()
        await asyncio.sleep(60)

    async def main():
        await aapp.migrate()
        job_id = await aapp.enqueue("forever", {})
        worker = asyncio.ensure_future(aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True))
        await asyncio.to_thread(started.wait, 30)
        state = await aapp.cancel_job(job_id, "no longer wanted")
        stats = await worker
        return job_id, state, stats

    job_id, state, stats = _run(main())
    job = aapp.app.get_job(job_id)
    assert job.state == "cancelled" and "no longer wanted" in job.last_error
    assert stats.done == 0
    assert db.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    aapp.app.close()


def test_a_stale_claimed_lease_is_fenced_off(dsn, db):
    """A claimed-lease run whose lease expired and was rescued cannot finish the job: its fenced write
    is refused, and the job's next attempt is the one that completes it."""
    aapp = skiplock.AsyncApp(dsn)
    first_started = threading.Event()
    release_first = asyncio.Event()

    @aapp.task(name="fenced", lease="claimed", lease_seconds=60)  # the heartbeat does not beat meanwhile
    async def fenced(job):
        if job.attempts == 1:
            first_started.set()
            await release_first.wait()
            return "stale run"
        return "second run"

    async def main():
        await aapp.migrate()
        job_id = await aapp.enqueue("fenced", {})
        worker = asyncio.ensure_future(aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True,
                                                             rescue_interval=60))
        await asyncio.to_thread(first_started.wait, 30)
        db.execute("UPDATE skiplock.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job_id])
        assert await asyncio.to_thread(aapp.app.backend.rescue_expired) == [(job_id, "queued")]
        release_first.set()
        return job_id, await worker

    job_id, stats = _run(main())
    job = aapp.app.get_job(job_id)
    assert (job.state, job.result, job.attempts) == ("done", "second run", 2)
    assert (stats.done, stats.lost) == (1, 1)
    aapp.app.close()


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_a_snooze_gives_its_attempt_back_and_retry_counts(dsn, lease):
    aapp = skiplock.AsyncApp(dsn)
    runs = []

    @aapp.task(name="snoozy", lease=lease, max_attempts=3)
    async def snoozy(job):
        runs.append(job.attempts)
        if len(runs) == 1:
            raise skiplock.Snooze(0)
        if len(runs) == 2:
            raise skiplock.Retry(in_=0)
        return len(runs)

    async def main():
        await aapp.migrate()
        job_id = await aapp.enqueue("snoozy", {})
        return job_id, await aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True)

    job_id, stats = _run(main())
    job = aapp.app.get_job(job_id)
    assert runs == [1, 1, 2]  # the snoozed run used no attempt; the retried one did
    assert (job.state, job.result, job.attempts) == ("done", 3, 2)
    assert (stats.snoozed, stats.retried, stats.done) == (1, 1, 1)
    aapp.app.close()


def test_cancelling_run_async_worker_stops_claiming_and_lets_jobs_in_flight_finish(dsn):
    aapp = skiplock.AsyncApp(dsn)
    started = asyncio.Event()

    @aapp.task(name="short", lease="claimed")
    async def short(job):
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    async def main():
        await aapp.migrate()
        first = await aapp.enqueue("short", {})
        worker = asyncio.ensure_future(aapp.run_async_worker(concurrency=1, max_connections=4))
        await started.wait()
        second = await aapp.enqueue("short", {})
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
        return first, second

    first, second = _run(main())
    assert aapp.app.get_job(first).state == "done"      # in flight: finished
    assert aapp.app.get_job(second).state == "queued"   # not claimed after the stop
    aapp.app.close()


def test_a_running_async_worker_is_a_live_worker_with_its_tasks(dsn):
    aapp = skiplock.AsyncApp(dsn)
    seen = []

    @aapp.task(name="look", lease="claimed")
    async def look(job):
        seen.append((await aapp.live_workers(), await aapp.untakeable_jobs()))

    async def main():
        await aapp.migrate()
        await aapp.enqueue("look", {})
        await aapp.enqueue("nobody_runs_this", {})
        await aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True)
        return await aapp.live_workers()

    after = _run(main())
    assert seen == [(1, [("default", "nobody_runs_this", 1)])]  # its row lists its tasks
    assert after == 0  # deleted when it exits
    aapp.app.close()


def test_a_task_with_flow_limits_is_refused_not_run_past_its_limit(dsn):
    """The asyncio worker has no flow claim (worker/flow.py): a task with concurrency/rate/partition_by
    is refused with one clear error before anything is claimed, never run without its slots."""
    aapp = skiplock.AsyncApp(dsn)

    @aapp.task(name="limited", concurrency=1)
    async def limited(job):
        return "ran"

    async def main():
        await aapp.migrate()
        job_id = await aapp.enqueue("limited", {})
        with pytest.raises(skiplock.ConfigurationError, match="limited.*App.worker"):
            await aapp.run_async_worker(concurrency=2, max_connections=3, stop_when_empty=True)
        return job_id

    job_id = _run(main())
    assert aapp.app.get_job(job_id).state == "queued"
    aapp.app.close()


def test_a_sync_handler_s_job_conn_writes_in_the_job_s_transaction_and_ends_with_its_run(dsn, db):
    """Under the transaction lease a sync handler (run in a thread) gets a sync job.conn on the lease's
    AsyncConnection: its statements run when called, its writes commit with the job or not at all, a
    savepoint rolls back alone, commit is refused with what to do instead, and a thread that outlived
    its run (a timeout) can run no statement in the connection's next transaction."""
    db.execute("CREATE TABLE effects (tag text)")
    aapp = skiplock.AsyncApp(dsn)
    late: list[str] = []
    late_done = threading.Event()

    @aapp.task(name="sync_writes")
    def sync_writes(job, tag):
        job.conn.execute("INSERT INTO effects VALUES (%s)", [tag])
        try:
            with job.conn.transaction():
                job.conn.execute("INSERT INTO effects VALUES ('undone by its savepoint')")
                raise ValueError("roll back the savepoint only")
        except ValueError:
            pass
        with job.conn.cursor() as cur:
            cur.execute("SELECT tag FROM effects ORDER BY tag")
            return [row[0] for row in cur]

    @aapp.task(name="sync_fails", max_attempts=1)
    def sync_fails(job):
        job.conn.execute("INSERT INTO effects VALUES ('rolled back with its attempt')")
        raise RuntimeError("boom after writing")

    @aapp.task(name="sync_commits", max_attempts=1)
    def sync_commits(job):
        job.conn.execute("INSERT INTO effects VALUES ('never committed by the handler')")
        job.conn.commit()

    @aapp.task(name="sync_outlives", max_attempts=1, timeout=0.5)
    def sync_outlives(job):
        time.sleep(2)  # past its timeout: the worker stops waiting, the thread goes on
        try:
            job.conn.execute("INSERT INTO effects VALUES ('from a thread that outlived its run')")
            late.append("ran")
        except skiplock.errors.ConfigurationError as exc:
            late.append(str(exc))
        finally:
            late_done.set()

    async def main():
        ids = [await aapp.enqueue("sync_writes", {"tag": "kept"}), await aapp.enqueue("sync_fails"),
               await aapp.enqueue("sync_commits"), await aapp.enqueue("sync_outlives")]
        await aapp.run_async_worker(concurrency=1, max_connections=4, stop_when_empty=True)
        return ids

    ok, fails, commits, outlives = _run(main())
    assert late_done.wait(10)
    app = aapp.app
    assert app.get_job(ok).state == "done" and app.get_job(ok).result == ["kept"]
    assert app.get_job(fails).state == "failed" and "boom after writing" in app.get_job(fails).last_error
    assert app.get_job(commits).state == "failed" and "'commit'" in app.get_job(commits).last_error
    assert app.get_job(outlives).state == "failed" and "timeout" in app.get_job(outlives).last_error
    assert len(late) == 1 and "run is over" in late[0], late
    assert [r[0] for r in db.execute("SELECT tag FROM effects")] == ["kept"]
    app.close()


def test_a_task_given_a_runtime_limit_is_left_queued_for_a_threaded_worker_until_the_limit_goes(dsn, caplog):
    """A limit set at runtime (`skiplock limit --task`, App.set_task_limits) on a task the asyncio worker
    runs: that worker has no flow claim, so it leaves the task's jobs queued (never runs them past the
    limit) and says so once; once the limit is cleared it runs them again."""
    aapp = skiplock.AsyncApp(dsn)
    ran: list[str] = []

    @aapp.task(name="metered")
    async def metered(job):
        ran.append("metered")

    @aapp.task(name="free")
    async def free(job):
        ran.append("free")

    async def main():
        await aapp.migrate()
        aapp.app.set_task_limits("metered", concurrency=1)
        metered_ids = [await aapp.enqueue("metered", {}) for _ in range(3)]
        free_id = await aapp.enqueue("free", {})
        await aapp.run_async_worker(concurrency=4, max_connections=4, stop_when_empty=True)
        states = [aapp.app.get_job(i).state for i in metered_ids], aapp.app.get_job(free_id).state
        aapp.app.set_task_limits("metered", clear=True)
        await aapp.run_async_worker(concurrency=4, max_connections=4, stop_when_empty=True)
        return states, [aapp.app.get_job(i).state for i in metered_ids]

    with caplog.at_level("WARNING", logger="skiplock.worker"):
        (held, free_state), after = _run(main())
    assert held == ["queued"] * 3 and free_state == "done"
    assert after == ["done"] * 3 and ran == ["free"] + ["metered"] * 3
    assert sum("metered has a limit set at runtime" in r.getMessage() for r in caplog.records) == 1
    aapp.app.close()


def test_the_asyncio_worker_says_once_when_the_schema_changes_under_it(dsn, db, caplog):
    """As the threaded worker (worker/schema_watch.py): a newer schema version while it runs is one
    WARNING, and it goes on running jobs."""
    import logging

    caplog.set_level(logging.WARNING, logger="skiplock.worker")
    aapp = skiplock.AsyncApp(dsn)
    done: list[int] = []

    @aapp.task(name="step")
    async def step(job, n):
        done.append(n)

    async def main():
        await aapp.migrate()
        runner = asyncio.ensure_future(aapp.run_async_worker(concurrency=2, max_connections=2,
                                                             poll_interval=0.05, schema_check_interval=0.05))
        await aapp.enqueue("step", {"n": 1})
        while 1 not in done:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(db.execute, "INSERT INTO skiplock.schema_version (version) VALUES (999)")
        while not any("schema changed while this worker runs" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # several more checks
        await aapp.enqueue("step", {"n": 2})
        while 2 not in done:
            await asyncio.sleep(0.02)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    _run(main())
    warnings = [r.getMessage() for r in caplog.records if "schema changed while this worker runs" in r.getMessage()]
    assert len(warnings) == 1 and "version 999" in warnings[0], warnings
    aapp.app.close()


def test_a_worker_of_every_queue_names_the_unpaused_queues_while_one_is_paused(dsn, db):
    """As the sync worker (tests/integration/test_paused_queue_view.py): its claims name the queues
    with jobs, never walking the paused backlog, and nothing paused runs; then the queue is resumed."""
    from skiplock.worker.aio_worker import AsyncWorker

    aapp = skiplock.AsyncApp(dsn)

    @aapp.task(name="noop")
    async def noop(job):
        return None

    app = aapp.app
    app.migrate()
    held = app.enqueue_many([("noop", {}, {"queue": "other"})] * 200)
    app.pause_queue("other")
    ids = app.enqueue_many([("noop", {})] * 30) + app.enqueue_many([("noop", {}, {"queue": "x"})] * 30)
    backend = app._ready()
    opener, seen = backend.async_leasing, []

    def recording(*args, **kwargs):  # the queues every claim of the worker's leasing names
        leasing = opener(*args, **kwargs)
        claim = leasing.claim

        async def counted(conn, queues, names, limit):
            seen.append(None if queues is None else list(queues))
            return await claim(conn, queues, names, limit)
        leasing.claim = counted
        return leasing
    backend.async_leasing = recording
    worker = AsyncWorker(app, concurrency=4, max_connections=4)
    stats = _run(worker.run(stop_when_empty=True))
    del backend.async_leasing
    assert stats.done == 60
    assert {app.get_job(i).state for i in ids} == {"done"}
    assert {app.get_job(i).state for i in held} == {"queued"}
    assert worker.queue_view is not None and worker.queue_view.reads >= 1
    assert seen[0] == ["default", "x"], seen  # the first claim: the queues with jobs, not every queue
    app.resume_queue("other")
    stats = _run(AsyncWorker(app, concurrency=4, max_connections=4).run(stop_when_empty=True))
    assert stats.done == 200
    app.close()


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_a_claim_the_server_refuses_every_time_is_retried_with_backoff_not_at_once(dsn, db, lease, caplog):
    """A claim that fails on a live session every time (here: a column the claim reads was renamed
    under the worker) is logged and tried again after a full-jitter backoff that doubles, never at
    once: the transaction-lease loop used to retry immediately, thousands of WARNINGs a second."""
    from skiplock.worker.aio_worker import AsyncWorker

    aapp = skiplock.AsyncApp(dsn)

    @aapp.task(name="never_runs", lease=lease)
    async def never_runs(job):
        return "ran"

    async def main():
        await aapp.migrate()
        await aapp.enqueue("never_runs", {})
        db.execute("ALTER TABLE skiplock.jobs RENAME COLUMN args TO args_renamed")
        worker = AsyncWorker(aapp.app, None, 2, max_connections=4)
        run = asyncio.ensure_future(worker.run())
        await asyncio.sleep(2.0)
        worker.stop()
        await asyncio.wait_for(run, 30)

    with caplog.at_level("WARNING", logger="skiplock.worker"):
        _run(main())
    failures = [r.getMessage() for r in caplog.records if '"args" does not exist' in r.getMessage()]
    assert failures, "the claim never failed: nothing was tested"
    # backoff from 0.25 s doubling (full jitter): a handful of tries in 2 s, where the loop that
    # retried at once made thousands
    assert len(failures) < 40, f"{len(failures)} failed claims in about 2 s"
    assert all("trying again in" in m for m in failures), failures[:3]
    db.execute("ALTER TABLE skiplock.jobs RENAME COLUMN args_renamed TO args")
    aapp.app.close()
