"""Job lifecycle: explicit retry/snooze/cancel, dead letters, delays, pauses, unique keys, timeouts,
cancellation, results and retention -- against a real PostgreSQL, with the races that matter."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import skiplock
from skiplock import Cancel, DuplicateJob, InvalidJob, JobFailed, Retry, Snooze, UnknownQueue, WaitTimeout

from test_worker import record, wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, slot text NOT NULL)")
    return db


def run_until_empty(app, **kw):
    return app.worker(concurrency=kw.pop("concurrency", 1), handle_signals=False, **kw).run(stop_when_empty=True)


# ---- explicit outcomes -------------------------------------------------------------------------------


def test_retry_snooze_and_cancel_from_a_handler(app, effects, db):
    @app.task(name="retry_me", max_attempts=2)
    def retry_me(job):
        record(job)
        raise Retry(in_=0)

    @app.task(name="snooze_me", max_attempts=1)
    def snooze_me(job):
        record(job)
        return Snooze(3600)

    @app.task(name="cancel_me")
    def cancel_me(job):
        record(job)
        raise Cancel("not needed any more")

    r, s, c = app.enqueue("retry_me"), app.enqueue("snooze_me"), app.enqueue("cancel_me")
    stats = run_until_empty(app)
    assert (stats.retried, stats.failed, stats.snoozed, stats.cancelled) == (1, 1, 1, 1)
    assert app.get_job(r).state == "failed" and app.get_job(r).attempts == 2
    snoozed = app.get_job(s)
    assert snoozed.state == "queued" and snoozed.attempts == 0  # a snooze is not an attempt
    assert snoozed.run_at > datetime.now(timezone.utc) + timedelta(minutes=50)
    cancelled = app.get_job(c)
    assert cancelled.state == "cancelled" and "not needed any more" in cancelled.last_error
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0  # all rolled back


def test_dead_letters_keep_every_error_and_can_be_retried(app, effects):
    calls = {"n": 0}

    @app.task(name="flaky", max_attempts=2, retry=0)
    def flaky(job):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ValueError(f"failure {calls['n']}")
        record(job)

    job_id = app.enqueue("flaky")
    other = app.enqueue("flaky", queue="elsewhere")
    run_until_empty(app, queues=["default"])
    dead = app.get_job(job_id)
    assert dead.state == "failed"
    assert [e["error"].splitlines()[0] for e in dead.errors] == ["ValueError: failure 1", "ValueError: failure 2"]
    assert app.list_jobs(state="failed")[0].id == job_id
    with pytest.raises(InvalidJob, match="only failed or cancelled"):
        app.retry_job(other)
    assert app.retry_failed(queue="elsewhere") == []
    app.retry_job(job_id)
    assert app.get_job(job_id).attempts == 0
    run_until_empty(app, queues=["default"])
    again = app.get_job(job_id)
    assert again.state == "done" and len(again.errors) == 2  # history kept


def test_retry_failed_requeues_all_failed_jobs(app):
    ids = [app.enqueue("nobody.handles.this") for _ in range(3)]
    run_until_empty(app, fail_unknown_tasks=True)  # a worker fails what it has no handler for, on request
    assert sorted(app.retry_failed()) == ids
    assert {app.get_job(i).state for i in ids} == {"queued"}


def _fail_now(db, *ids):
    db.execute("UPDATE skiplock.jobs SET state = 'failed', finished_at = now() WHERE id = ANY(%s)", [list(ids)])


def test_retry_failed_retries_what_it_can_and_says_why_not_for_the_rest(app, db):
    """A failed job's unique key may be held again by a newer queued job (the partial unique index
    allows one queued or running job per key): that job is not retried, the others are."""
    held = app.enqueue("t", unique_key="k1")
    free = app.enqueue("t", unique_key="k2")
    keyless = app.enqueue("t")
    _fail_now(db, held, free, keyless)
    holder = app.enqueue("t", unique_key="k1")  # the key is free again: a newer job takes it
    twin = app.enqueue("t", unique_key="k2")
    _fail_now(db, twin)  # two failed jobs share k2: only the first can be queued again

    result = app.retry_failed()
    assert result == [free, keyless]  # still the list of ids retried
    assert sorted(result.not_retried) == [held, twin]
    assert result.not_retried[held].existing_id == holder and "k1" in str(result.not_retried[held])
    assert result.not_retried[twin].existing_id == free and "k2" in str(result.not_retried[twin])
    assert [app.get_job(i).state.value for i in (held, free, keyless, holder, twin)] == \
        ["failed", "queued", "queued", "queued", "failed"]
    assert app.retry_failed() == [] and sorted(app.retry_failed().not_retried) == [held, twin]


def test_retry_job_whose_unique_key_is_held_raises_a_clear_error(app, db):
    job_id = app.enqueue("t", unique_key="k")
    _fail_now(db, job_id)
    holder = app.enqueue("t", unique_key="k")
    with pytest.raises(DuplicateJob, match=f"job {holder} holds its unique_key 'k'") as caught:
        app.retry_job(job_id)
    assert caught.value.existing_id == holder
    assert app.get_job(job_id).state == "failed"
    app.cancel_job(holder)
    app.retry_job(job_id)  # the key is free: retried
    assert app.get_job(job_id).state == "queued"


@pytest.mark.parametrize("verb", ["retry_failed", "retry_job"])
def test_retry_while_a_key_is_being_taken(app, dsn, db, verb):
    """An enqueuer takes the failed job's key in a transaction still open when the retry runs: the
    retry's UPDATE waits for it on the unique index and, once it commits, fails there -- the retry
    then reports the new holder instead of raising a database error."""
    job_id = app.enqueue("t", unique_key="k")
    other = app.enqueue("t")
    _fail_now(db, job_id, other)
    taker_app = skiplock.App(dsn)
    with psycopg.connect(dsn) as taker:
        holder = taker_app.enqueue("t", unique_key="k", conn=taker)  # not committed yet
        outcome: list[object] = []

        def retry() -> None:
            try:
                outcome.append(app.retry_failed() if verb == "retry_failed" else app.retry_job(job_id))
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        t = threading.Thread(target=retry)
        t.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND datname = current_database()").fetchone()[0])  # the retry waits
        taker.commit()
        t.join(timeout=30)
    taker_app.close()
    [result] = outcome
    if verb == "retry_failed":
        assert result == [other] and list(result.not_retried) == [job_id], result
        assert result.not_retried[job_id].existing_id == holder
    else:
        assert isinstance(result, DuplicateJob) and result.existing_id == holder, result
    assert app.get_job(job_id).state == "failed"


# ---- delays and priorities -----------------------------------------------------------------------------


def test_delayed_job_waits_and_does_not_hold_up_ready_jobs(app, effects):
    @app.task(name="effect")
    def effect(job):
        record(job)

    delayed = app.enqueue("effect", delay=3600, priority=-100)  # first in line, but not due
    ready = [app.enqueue("effect") for _ in range(3)]
    stats = run_until_empty(app)
    assert stats.done == 3
    assert app.get_job(delayed).state == "queued"
    assert sorted(r[0] for r in effects.execute("SELECT job_id FROM effects")) == ready


def test_due_delayed_job_runs(app, effects, db):
    @app.task(name="effect")
    def effect(job):
        record(job)

    job_id = app.enqueue("effect", delay=3600)
    db.execute("UPDATE skiplock.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [job_id])
    run_until_empty(app)
    assert app.get_job(job_id).state == "done"


# ---- pause and resume ----------------------------------------------------------------------------------


def test_pause_while_workers_run_then_resume(app, effects, db):
    @app.task(name="effect", queue="mail")
    def effect(job):
        record(job)

    first = app.enqueue("effect")
    worker = app.worker(queues=["mail", "other"], concurrency=2, poll_interval=0.02, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: app.get_job(first).state == "done")
        app.pause_queue("mail")
        assert [q for q in app.queues() if q["queue"] == "mail"][0]["paused"] is True
        held = app.enqueue("effect")
        elsewhere = app.enqueue("effect", queue="other")
        wait_for(lambda: app.get_job(elsewhere).state == "done")  # the worker is claiming...
        wait_for(lambda: worker.stats.done == 2)  # (a job is counted just after its COMMIT)
        polls = worker.stats.done
        time.sleep(0.3)  # ...many claim cycles (poll 0.02 s) pass...
        assert app.get_job(held).state == "queued"  # ...and none took the paused queue's job
        assert worker.stats.done == polls
        assert app.resume_queue("mail") is True
        wait_for(lambda: app.get_job(held).state == "done")
    finally:
        worker.stop()
        thread.join(30)
    assert app.resume_queue("mail") is False


def test_pause_unknown_queue_is_refused_unless_forced(app):
    with pytest.raises(UnknownQueue, match="unknown queue 'nope'"):
        app.pause_queue("nope")
    app.pause_queue("nope", force=True)
    assert [q["queue"] for q in app.queues()] == ["nope"]


# ---- unique jobs ---------------------------------------------------------------------------------------


def test_unique_key_race_between_concurrent_enqueuers(dsn, db):
    apps = [skiplock.App(dsn) for _ in range(8)]
    for rnd in range(10):
        barrier = threading.Barrier(len(apps))
        ids: list[int] = []

        def go(a: skiplock.App) -> None:
            barrier.wait()
            ids.append(a.enqueue("invoice", {"n": rnd}, unique_key=f"invoice:{rnd}"))

        threads = [threading.Thread(target=go, args=(a,)) for a in apps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(ids)) == 1, ids
    assert db.execute("SELECT count(*), count(DISTINCT unique_key) FROM skiplock.jobs").fetchone() == (10, 10)
    for a in apps:
        a.close()


def test_unique_key_returns_or_raises_and_frees_after_finish(app):
    @app.task(name="invoice")
    def invoice(job):
        pass

    first = app.enqueue("invoice", unique_key="invoice:42")
    assert app.enqueue("invoice", unique_key="invoice:42") == first
    with pytest.raises(DuplicateJob) as info:
        app.enqueue("invoice", unique_key="invoice:42", on_conflict="raise")
    assert info.value.existing_id == first
    run_until_empty(app)
    second = app.enqueue("invoice", unique_key="invoice:42")  # the key is free once the job finished
    assert second != first and app.get_job(second).unique_key == "invoice:42"


def test_unique_key_in_the_callers_transaction(app, dsn):
    with psycopg.connect(dsn) as conn:
        a = app.enqueue("t", unique_key="k", conn=conn)
        assert app.enqueue("t", unique_key="k", conn=conn) == a
        conn.rollback()
    assert app.enqueue("t", unique_key="k") != a


# ---- timeouts -----------------------------------------------------------------------------------------


def test_timeout_of_a_handler_stuck_in_sleep_frees_the_slot(app, effects):
    @app.task(name="stuck", timeout=0.5, max_attempts=1)
    def stuck(job):
        record(job)
        time.sleep(30)

    @app.task(name="quick")
    def quick(job):
        record(job)

    stuck_id = app.enqueue("stuck", priority=-1)
    quick_id = app.enqueue("quick")
    stats = run_until_empty(app, concurrency=1)  # one slot: the quick job needs it back
    job = app.get_job(stuck_id)
    assert job.state == "failed" and "timeout of 0.5s" in job.last_error
    assert app.get_job(quick_id).state == "done"
    assert stats.done == 1 and stats.failed == 1
    assert [r[0] for r in effects.execute("SELECT job_id FROM effects")] == [quick_id]  # stuck one rolled back


def test_timeout_of_a_long_statement_is_enforced_by_postgres(app):
    @app.task(name="slow_sql", timeout=0.5, max_attempts=2, retry=0)
    def slow_sql(job):
        job.conn.execute("SELECT pg_sleep(30)")

    job_id = app.enqueue("slow_sql")
    run_until_empty(app)
    job = app.get_job(job_id)
    assert job.state == "failed" and job.attempts == 2
    assert "timeout" in job.last_error


# ---- cancellation -------------------------------------------------------------------------------------


def test_cancel_queued_job_never_runs(app, effects):
    @app.task(name="effect")
    def effect(job):
        record(job)

    job_id = app.enqueue("effect")
    assert app.cancel_job(job_id) == "cancelled"
    run_until_empty(app)
    assert app.get_job(job_id).state == "cancelled"
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    with pytest.raises(skiplock.JobNotFound):
        app.cancel_job(999999)


def test_cancel_while_running_rolls_back_and_ends_cancelled(app, effects):
    started = threading.Event()

    @app.task(name="long")
    def long(job):
        record(job)
        started.set()
        for _ in range(1000):
            job.conn.execute("SELECT pg_sleep(0.02)")

    job_id = app.enqueue("long")
    worker = app.worker(concurrency=1, poll_interval=0.02, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert started.wait(20)
        assert app.cancel_job(job_id, reason="user asked") == "cancelled"
    finally:
        worker.stop()
        thread.join(30)
    job = app.get_job(job_id)
    assert job.state == "cancelled" and "user asked" in job.last_error
    assert effects.execute("SELECT count(*) FROM effects").fetchone()[0] == 0


def test_finishing_write_never_overwrites_a_cancellation(app, dsn):
    """A cancellation requested while the handler runs wins over its 'done'."""
    @app.task(name="t")
    def t(job):
        app.backend.request_cancel(job.id, "requested mid-run")  # another session, no lock wait

    job_id = app.enqueue("t")
    stats = run_until_empty(app)
    assert stats.cancelled == 1 and stats.done == 0
    assert app.get_job(job_id).state == "cancelled"


def test_cancel_a_finished_job_leaves_it(app):
    @app.task(name="t")
    def t(job):
        return 1

    job_id = app.enqueue("t")
    run_until_empty(app)
    assert app.cancel_job(job_id) == "done"
    assert app.get_job(job_id).result == 1


# ---- results and wait ---------------------------------------------------------------------------------


def test_wait_returns_the_result_or_raises(app):
    @app.task(name="double")
    def double(job, x):
        time.sleep(0.2)
        return 2 * x

    @app.task(name="bad", max_attempts=1)
    def bad(job):
        raise KeyError("missing")

    ok, ko, never = app.enqueue("double", {"x": 21}), app.enqueue("bad"), app.enqueue("double", {"x": 1}, delay=3600)
    worker = app.worker(concurrency=2, poll_interval=0.02, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert app.wait(ok, timeout=30) == 42
        with pytest.raises(JobFailed, match="ended failed") as info:
            app.wait(ko, timeout=30)
        assert "KeyError" in info.value.job.last_error
        with pytest.raises(WaitTimeout):
            app.wait(never, timeout=0.3)
    finally:
        worker.stop()
        thread.join(30)
    assert app.backend._all("paused_queues") == []  # (smoke: pool still healthy)


def test_a_result_too_large_fails_with_a_clear_error(dsn):
    app = skiplock.App(dsn, max_result_bytes=1000)

    @app.task(name="big", max_attempts=1)
    def big(job):
        return "x" * 5000

    job_id = app.enqueue("big")
    run_until_empty(app)
    assert "the limit is 1,000" in app.get_job(job_id).last_error
    app.close()


# ---- retention ----------------------------------------------------------------------------------------


def test_prune_deletes_old_finished_jobs_in_batches_and_keeps_the_rest(app, db):
    @app.task(name="t")
    def t(job):
        pass

    ids = app.enqueue_many([("t", {})] * 30)
    run_until_empty(app)
    queued = app.enqueue("t", delay=3600)
    failed = app.enqueue("nobody")
    run_until_empty(app)
    db.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 days' WHERE id = ANY(%s)", [ids[:25]])
    deleted = app.prune(batch=10)
    assert deleted["done"] == 25 and deleted["failed"] == 0
    remaining = {r[0] for r in db.execute("SELECT id FROM skiplock.jobs")}
    assert remaining == set(ids[25:]) | {queued, failed}


def test_bad_lifecycle_input_is_refused(app):
    with pytest.raises(skiplock.ConfigurationError, match="invalid cron expression"):
        app.periodic("every five minutes")(lambda job: None)
    with pytest.raises(skiplock.ConfigurationError, match="unknown time zone"):
        app.periodic("* * * * *", timezone="Mars/Olympus")(lambda job: None)
    with pytest.raises(skiplock.ConfigurationError, match="timeout"):
        app.task(name="x", timeout=-1)
    with pytest.raises(InvalidJob, match="delay"):
        app.enqueue("t", delay=-5)
    with pytest.raises(skiplock.ConfigurationError, match="retention"):
        skiplock.App(app.dsn, retention={"queued": 1})
