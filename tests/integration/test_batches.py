"""Batched claims: fast jobs share one transaction (one commit), each still in its own savepoint;
slow jobs are claimed one at a time; a batch that dies charges none of its jobs but the one that
killed it (see test_crash.py for the process-level version)."""

from __future__ import annotations

import collections
import threading
import time

import psycopg
import pytest

from skiplock.worker.batching import BatchPolicy, WholeBatches
from test_worker import wait_for


@pytest.fixture
def effects(db):
    db.execute("CREATE TABLE effects (job_id bigint NOT NULL, xact xid8 NOT NULL)")
    return db


def whole(batch_size: int, batch_budget: float = 60.0, batch_slots: int = 1) -> WholeBatches:
    """Slots claim ``batch_size`` jobs from their first claim on, and every task counts as fast, so the
    batches are exactly jobs 1..N, N+1..2N, ... of the queue (the ramp and the measuring of tasks are
    tested on their own, below): the worker's batching policy, injected."""
    return WholeBatches(batch_size, batch_budget, batch_slots)


def record(job) -> None:
    """The job's effect, with its top-level transaction id (the same for every job of one batch)."""
    job.conn.execute("INSERT INTO effects VALUES (%s, pg_current_xact_id())", [job.id])


def run_until_empty(app, **options):
    options = {"handle_signals": False, "maintenance": False, "batch_budget": 60, **options}
    return app.worker(**options).run(stop_when_empty=True)


def batches_of(db, ids) -> list[list[int]]:
    """Jobs grouped by the transaction that wrote them done (a batch's jobs share one row version
    creator: the lease transaction)."""
    rows = db.execute("SELECT xmin::text, array_agg(id ORDER BY id) FROM skiplock.jobs WHERE id = ANY(%s) "
                      "GROUP BY 1 ORDER BY 2", [ids]).fetchall()
    return [r[1] for r in rows]


def test_fast_jobs_share_commits_and_each_is_done_once(app, db):
    app.task(name="noop")(lambda job: None)
    ids = app.enqueue_many([("noop", {})] * 300)
    stats = run_until_empty(app, concurrency=2, batch_size=32)
    assert stats.done == 300
    rows = db.execute("SELECT state, attempts, count(*) FROM skiplock.jobs GROUP BY 1, 2").fetchall()
    assert rows == [("done", 1, 300)]
    groups = batches_of(db, ids)
    assert sorted(i for g in groups for i in g) == ids
    assert max(len(g) for g in groups) == 32  # the claim size grew to batch_size
    assert len(groups) < 300 / 5  # on average more than 5 jobs per commit
    # A batch that commits leaves no trace, nor does a counted attempt that finished.
    assert db.execute("SELECT count(*) FROM skiplock.job_batches").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0] == 0


def test_a_failing_job_rolls_back_only_its_own_work_inside_a_shared_transaction(app, effects):
    @app.task(name="maybe", max_attempts=1)
    def maybe(job, fail):
        record(job)
        if fail:
            raise RuntimeError("this one fails")

    ids = app.enqueue_many([("maybe", {"fail": n == 10}) for n in range(16)])
    stats = run_until_empty(app, concurrency=1, batch_policy=whole(8))
    assert (stats.done, stats.failed) == (15, 1)
    rows = effects.execute("SELECT job_id, xact::text FROM effects ORDER BY job_id").fetchall()
    assert [r[0] for r in rows] == ids[:10] + ids[11:]  # the failed job's insert is gone, nobody else's
    xact = dict(rows)
    # Jobs 8..15 are one batch (one claim, in id order): the failing job 10 ran between batch-mates
    # that committed together.
    mates = [i for i in ids[8:] if i != ids[10]]
    assert len({xact[i] for i in mates}) == 1, "the failing job's batch-mates did not share a transaction"
    assert len({xact[i] for i in ids[:8]}) == 1 and xact[ids[0]] != xact[ids[8]]
    failed = app.get_job(ids[10])
    assert failed.state == "failed" and "this one fails" in failed.last_error


def test_a_cancellation_requested_while_a_batch_runs_wins_over_done(app, db, dsn):
    started = []

    @app.task(name="step")
    def step(job, cancel=None):
        started.append(job.id)
        if cancel is not None:  # a cancellation request for an earlier batch-mate, as cancel_job writes it
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("INSERT INTO skiplock.job_cancellations (job_id, reason) VALUES (%s, 'changed my mind')",
                              [cancel])

    ids = app.enqueue_many([("step", {})] * 3)
    last = app.enqueue("step", {"cancel": ids[1]})
    stats = run_until_empty(app, concurrency=1, batch_policy=whole(4))  # all four in one batch
    assert started == ids + [last]
    cancelled = app.get_job(ids[1])
    assert cancelled.state == "cancelled", cancelled
    assert "changed my mind" in cancelled.last_error
    assert [app.get_job(i).state for i in [ids[0], ids[2], last]] == ["done"] * 3
    assert (stats.done, stats.cancelled) == (3, 1)
    assert db.execute("SELECT count(*) FROM skiplock.job_cancellations").fetchone()[0] == 0


def test_jobs_a_quarter_of_the_budget_long_are_batched_and_longer_ones_are_not(app, db):
    """A task is fast -- batched -- when at least four of its jobs fit in the batch budget
    (``batch_budget / 4`` at the first quartile of its recent runs): 40 ms jobs with a 0.25 s budget
    share transactions; 100 ms jobs (over a quarter) each commit alone. Before, the line was a tenth
    of the budget, and jobs like the 40 ms ones ran alone, a claim and a COMMIT each."""
    app.task(name="medium")(lambda job: time.sleep(0.04))
    app.task(name="long")(lambda job: time.sleep(0.1))
    medium = app.enqueue_many([("medium", {})] * 60)
    stats = run_until_empty(app, concurrency=1, batch_size=8, batch_budget=0.25)
    assert stats.done == 60
    groups = batches_of(db, medium)
    assert max(len(g) for g in groups) >= 4, groups  # measured fast after its first runs: batched
    long = app.enqueue_many([("long", {})] * 20)
    stats = run_until_empty(app, concurrency=1, batch_size=8, batch_budget=0.25)
    assert stats.done == 20
    assert all(len(g) == 1 for g in batches_of(db, long))


def test_slow_jobs_are_claimed_one_at_a_time(app):
    """Four slow jobs and four slots: they must all run at once (a barrier of four). A slot that
    claimed all four and ran them one after another would break the barrier."""
    app.task(name="fast")(lambda job: None)
    barrier = threading.Barrier(4, timeout=30)

    @app.task(name="slow")
    def slow(job):
        barrier.wait()

    worker = app.worker(concurrency=4, batch_size=32, poll_interval=0.05, handle_signals=False, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        worker.started.wait(10)
        app.enqueue_many([("fast", {})] * 2000)  # every slot's claim size grows
        wait_for(lambda: app.counts() == [("default", "done", 2000)])
        ids = app.enqueue_many([("slow", {})] * 4)
        wait_for(lambda: all(app.get_job(i).state == "done" for i in ids))
        assert worker.stats.failed == 0
        assert not barrier.broken
    finally:
        worker.stop()
        thread.join(30)


def test_cancelling_a_job_in_a_batch_reruns_its_batch_mates_alone(app, db, effects):
    """cancel_job ends the session holding the job's batch: the whole batch rolls back; the
    cancelled job ends cancelled, every other job of the batch runs again, alone, with a counted
    attempt -- and nothing is done twice."""
    release = threading.Event()
    target: list[int] = []

    @app.task(name="work")
    def work(job, block=False):
        record(job)
        if block:
            target.append(job.id)
            release.wait(30)

    before = app.enqueue_many([("work", {})] * 3)
    blocker = app.enqueue("work", {"block": True})
    after = app.enqueue_many([("work", {})] * 4)
    worker = app.worker(concurrency=1, batch_policy=whole(8), poll_interval=0.05, handle_signals=False,
                        maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: target == [blocker])
        batch = db.execute("SELECT ids FROM skiplock.job_batches").fetchone()[0]
        assert blocker in batch and set(before) <= set(batch), batch  # it really is running in a batch
        assert app.cancel_job(blocker, wait=10) == "cancelled"
        release.set()
        every = before + after
        wait_for(lambda: all(app.get_job(i).state == "done" for i in every))
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY 1").fetchall())
    assert per_job == {i: 1 for i in before + after}
    for i in before:  # rolled back with the batch, then run alone: one counted attempt
        assert app.get_job(i).attempts == 1
    assert app.get_job(blocker).state == "cancelled"


@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_cancellation_that_refuses_a_writing_handlers_done_rolls_back_its_writes(app, dsn, effects, batch_size):
    """A writing handler's ``done`` is written by the lease's top transaction, its savepoint released
    first (no MultiXact: test_no_multixacts.py). If a cancellation request committed meanwhile refuses
    it, its writes can no longer be undone alone: the lease's whole transaction rolls back, as
    cancel_job ending the session does. The job ends cancelled with no effect; its batch-mates run
    again, and nothing is done twice."""
    asked: list[int] = []

    @app.task(name="work")
    def work(job, cancel_me=False):
        record(job)
        if cancel_me and job.id not in asked:  # a request as cancel_job writes it, before it ends the session
            asked.append(job.id)
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("INSERT INTO skiplock.job_cancellations (job_id, reason) VALUES (%s, 'no longer wanted')",
                              [job.id])

    before = app.enqueue_many([("work", {})] * 3)
    target = app.enqueue("work", {"cancel_me": True})
    after = app.enqueue_many([("work", {})] * 4)
    stats = run_until_empty(app, concurrency=1, batch_policy=whole(batch_size), poll_interval=0.05)
    cancelled = app.get_job(target)
    assert cancelled.state == "cancelled" and "no longer wanted" in cancelled.last_error, cancelled
    per_job = dict(effects.execute("SELECT job_id, count(*) FROM effects GROUP BY 1").fetchall())
    assert per_job == {i: 1 for i in before + after}  # the cancelled job's write is gone
    assert [app.get_job(i).state for i in before + after] == ["done"] * 7
    assert (stats.done, stats.cancelled) == (7, 1)
    assert effects.execute("SELECT count(*) FROM skiplock.job_cancellations").fetchone()[0] == 0


def batches_seen_by_handlers(app, dsn, jobs: int, sleep: float, running: list[int] | None = None,
                             task_options: dict | None = None, **worker) -> list[int]:
    """Drain ``jobs`` jobs whose handler counts the batches in flight (their rows in job_batches,
    written before a batch's first handler and deleted by its COMMIT) from a connection of its own,
    then sleeps ``sleep`` seconds. Returns the counts seen; ``running`` gets, per handler of a job
    in a batch (its id in a job_batches row), how many such handlers were running at once (itself
    included) during a millisecond. ``task_options``: the task's (flow-control limits, say)."""
    local = threading.local()
    conns: list[psycopg.Connection] = []
    seen: list[int] = []
    lock = threading.Lock()
    now_running = [0]

    @app.task(name="look", **(task_options or {}))
    def look(job):
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(dsn, autocommit=True)
            conns.append(local.conn)
        in_flight, mine = local.conn.execute("SELECT count(*), count(*) FILTER (WHERE %s = ANY(ids)) "
                                             "FROM skiplock.job_batches", [job.id]).fetchone()
        seen.append(in_flight)
        if running is not None and mine:
            with lock:
                now_running[0] += 1
                running.append(now_running[0])
            time.sleep(0.001)
            with lock:
                now_running[0] -= 1
        if sleep:
            time.sleep(sleep)

    app.enqueue_many([("look", {})] * jobs)
    try:
        stats = run_until_empty(app, **worker)
    finally:
        for conn in conns:
            conn.close()
    assert stats.done == jobs
    return seen


@pytest.mark.parametrize("batch_slots", [1, 2])
def test_no_more_batches_in_flight_than_batch_slots(app, dsn, batch_slots):
    """Every batch counts as one of near-instant jobs here (the handler's own query may take longer
    than that on a busy machine), so every batch takes a turn: at most ``batch_slots`` batches run
    their jobs at once. A batch gives its turn back once its last job has run, before its COMMIT, so
    batches still committing (their rows still in job_batches until the commit lands; how many
    depends on the disk's flush time) are not bounded by it."""
    policy = BatchPolicy(batch_size=16, batch_budget=60, batch_slots=batch_slots, instant_seconds=60.0)
    running: list[int] = []
    seen = batches_seen_by_handlers(app, dsn, 1500, 0.0, running=running, concurrency=6, batch_policy=policy)
    assert 1 <= max(running) <= batch_slots, collections.Counter(running)
    assert max(seen) >= 1, collections.Counter(seen)  # batches were seen in flight


@pytest.mark.parametrize("flow_batch_slots", [1, 2])
def test_flow_controlled_batches_take_turns_of_their_own(app, dsn, flow_batch_slots):
    """Batches of flow-controlled jobs (a task limit: the flow claim's) take turns of their own,
    ``flow_batch_slots``, whatever ``batch_slots`` is: at most that many run their jobs at once, and
    with two turns two do, while plain batches have one."""
    policy = BatchPolicy(batch_size=16, batch_budget=60, batch_slots=1, instant_seconds=60.0,
                         flow_batch_slots=flow_batch_slots)
    running: list[int] = []
    batches_seen_by_handlers(app, dsn, 1500, 0.0, running=running, concurrency=6, batch_policy=policy,
                             task_options={"concurrency": 100})
    assert max(running) == flow_batch_slots, collections.Counter(running)


def test_batches_of_jobs_that_wait_run_on_every_slot(app, dsn):
    """Jobs that take a few milliseconds (waiting, not computing) are still batched, but their
    batches do not take turns: several run at once even with batch_slots=1."""
    seen = batches_seen_by_handlers(app, dsn, 400, 0.003, concurrency=4, batch_size=8, batch_slots=1)
    assert max(seen) >= 2


def test_a_failure_recorded_in_a_batch_survives_a_later_job_rolling_back_to_its_savepoint(app, dsn):
    """Job A does not touch the database and fails: its failure is written in the batch's transaction.
    Job B, later in the same batch, writes and fails: rolling back to B's savepoint must not take A's
    record with it (A would then run again)."""
    runs: dict[str, int] = {}
    seen_from_outside: list[str] = []

    @app.task(name="quiet", max_attempts=1)
    def quiet(job, name):
        runs[name] = runs.get(name, 0) + 1
        raise RuntimeError(f"{name} fails quietly")

    @app.task(name="loud", max_attempts=1)
    def loud(job, name, other=None):
        runs[name] = runs.get(name, 0) + 1
        job.conn.execute("SELECT 1")
        if other is not None:  # A's failure is not committed yet: A and B share B's transaction
            with psycopg.connect(dsn) as outside:
                seen_from_outside.append(outside.execute("SELECT state FROM skiplock.jobs WHERE id = %s",
                                                         [other]).fetchone()[0])
        raise RuntimeError(f"{name} fails loudly")

    a = app.enqueue("quiet", {"name": "A"})
    b = app.enqueue("loud", {"name": "B", "other": a})
    run_until_empty(app, concurrency=1, batch_policy=whole(4))
    assert seen_from_outside == ["queued"], "A and B did not run in one batch: nothing was tested"
    assert runs["A"] == 1 and runs["B"] == 1, runs
    assert app.get_job(a).state == "failed" and "A fails quietly" in app.get_job(a).last_error
    assert app.get_job(b).state == "failed" and "B fails loudly" in app.get_job(b).last_error


def test_every_kind_of_outcome_in_one_batch(app, dsn, effects):
    """Done, done with a write, retry, snooze and a result that is not JSON, in one transaction: each
    is written as it would be alone, and only the writing job's effect exists."""
    from skiplock import Retry, Snooze

    seen_from_outside: list[str] = []

    @app.task(name="mixed")
    def mixed(job, do, first=None):
        if do == "retry":
            raise Retry(in_=3600)
        if do == "snooze":
            raise Snooze(3600)
        if do == "badresult":
            return {"not": object()}
        if do == "write":
            record(job)
            with psycopg.connect(dsn) as outside:  # the batch's first job is not committed yet
                seen_from_outside.append(outside.execute("SELECT state FROM skiplock.jobs WHERE id = %s",
                                                         [first]).fetchone()[0])
            return {"wrote": True}
        return None

    ids = app.enqueue_many([("mixed", {"do": d}) for d in ("ok", "retry", "snooze", "badresult")])
    ids.append(app.enqueue("mixed", {"do": "write", "first": ids[0]}))
    run_until_empty(app, concurrency=1, batch_policy=whole(8))
    assert seen_from_outside == ["queued"], "the jobs did not share a batch: nothing was tested"
    ok, retry, snooze, bad, write = (app.get_job(i) for i in ids)
    assert (ok.state, ok.attempts) == ("done", 1)
    assert (retry.state, retry.attempts) == ("queued", 1) and "retry" in retry.last_error.lower()
    assert (snooze.state, snooze.attempts) == ("queued", 0) and snooze.last_error is None
    assert (bad.state, bad.attempts) == ("queued", 1) and "JSON" in bad.last_error
    assert (write.state, write.attempts, write.result) == ("done", 1, {"wrote": True})
    for job in (retry, snooze, bad):
        assert job.run_at > ok.finished_at
    assert [r[0] for r in effects.execute("SELECT job_id FROM effects").fetchall()] == [ids[4]]


def test_a_stuck_batch_does_not_stop_the_other_slots(app):
    """A near-instant task hangs once, in a batch that holds the only batch turn: the other slot stops
    waiting for the turn after a few batch budgets and claims one job at a time meanwhile."""
    release = threading.Event()

    @app.task(name="quick")
    def quick(job, hang=False):
        if hang:
            release.wait(30)

    stuck = app.enqueue_many([("quick", {"hang": True})] + [("quick", {})] * 3)  # one claim of 4
    later = app.enqueue_many([("quick", {})] * 3)
    worker = app.worker(concurrency=2, batch_policy=whole(4, batch_budget=0.05, batch_slots=1), poll_interval=0.05, handle_signals=False,
                        maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: all(app.get_job(i).state == "done" for i in later), timeout=20)
        assert app.get_job(stuck[0]).state == "queued"  # still hanging, its batch not committed
        release.set()
        wait_for(lambda: all(app.get_job(i).state == "done" for i in stuck), timeout=20)
    finally:
        release.set()
        worker.stop()
        thread.join(30)



def test_jobs_a_short_batch_released_at_its_commit_run_without_waiting_for_a_poll(app):
    """A claim that came back short found every available job, so its slot may sleep until a
    NOTIFY -- but not when its batch ran out of time: the jobs it released at its COMMIT sent no
    NOTIFY, and the slot claims them again at once (here the poll is a minute away)."""
    @app.task(name="slowish")
    def slowish(job):
        time.sleep(0.02)

    ids = app.enqueue_many([("slowish", {})] * 5)  # one claim of 5 (short of 8); 2 fit in the budget
    worker = app.worker(concurrency=1, batch_policy=whole(8, batch_budget=0.03), poll_interval=60,
                        handle_signals=False, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: worker.listener is not None and worker.listener.listening.is_set(), timeout=20)
        wait_for(lambda: all(app.get_job(i).state == "done" for i in ids), timeout=20)
    finally:
        worker.stop()
        thread.join(30)


def test_a_batchs_results_are_stored_as_returned_whatever_characters_they_hold(app, db):
    """A batch's results go to the server as one JSON array (``json_array``): quotes, backslashes,
    JSON escapes, characters beyond the BMP and None come back as each handler returned them, in one
    transaction -- and a None is stored SQL NULL, as a lone job's is, never a JSON null."""
    tricky = 'tab\there\nnew\rline back\\slash "quoted" \\u0000 {a,b} NULL é € 😀'
    results = [tricky, {"k": tricky, "n": [1, None, 2.5]}, None, "", [tricky, "\\"], 0, True, '"'] * 4

    @app.task(name="returns")
    def returns(job, i):
        return results[i]

    ids = app.enqueue_many([("returns", {"i": i}) for i in range(len(results))])
    run_until_empty(app, concurrency=1, batch_policy=whole(len(results)))
    xacts = {r[0] for r in db.execute("SELECT xmin::text FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall()}
    assert len(xacts) == 1, "the jobs did not share a batch: nothing was tested"
    assert [app.get_job(i).result for i in ids] == results
    nulls = db.execute("SELECT count(*) FILTER (WHERE result IS NULL), count(*) FILTER (WHERE result = 'null'::jsonb)"
                       " FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchone()
    assert nulls == (results.count(None), 0)
