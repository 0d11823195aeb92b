"""Crashes: a worker SIGKILLed with jobs in flight loses nothing and doubles nothing; a handler that
kills its own worker ends ``failed`` after max_attempts; a handler raising BaseException is recorded and
the worker carries on."""

from __future__ import annotations

import signal
import time

import pytest

from acceptance_support import effects_of, in_flight, job_row, run_cli, scalar, wait_for, crash_a_batch_until_done

N_JOBS = 2000


def _lease_sessions_busy(db, w) -> int:
    """Lease sessions of ``w`` that are executing a statement (rather than waiting for the client: idle in
    transaction, or -- stopped in the middle of a pipeline, before its Sync -- active but reading from
    the client)."""
    return scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s AND state = 'active' "
                      "AND wait_event IS DISTINCT FROM 'ClientRead'", [f"skiplock-worker {w.slot_pattern}"])


def _active_sessions(db) -> str:
    rows = db.execute("SELECT application_name, wait_event_type, wait_event, left(query, 200) FROM pg_stat_activity "
                      "WHERE state = 'active' AND pid <> pg_backend_pid()").fetchall()
    return "active sessions:\n" + "\n".join(map(repr, rows))


def _freeze_with_jobs_in_flight(db, victim, timeout: float = 60) -> dict[int, str]:
    """SIGSTOP ``victim`` at a moment it has job(s) in flight and return them (see ``in_flight``).

    A stopped process sends nothing, so once its lease sessions are idle (in transaction) its set of
    uncommitted transactions cannot change: the rows in job_attempts and job_batches naming it are
    exactly the jobs whose transactions the kill will roll back.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if in_flight(db, victim):
            victim.signal(signal.SIGSTOP)
            wait_for(lambda: _lease_sessions_busy(db, victim) == 0, 10, "the stopped worker's sessions to go idle",
                     interval=0.01, on_timeout=lambda: _active_sessions(db))
            time.sleep(0.05)  # let any message already in a socket buffer be processed, then re-check
            wait_for(lambda: _lease_sessions_busy(db, victim) == 0, 10, "the stopped worker's sessions to go idle",
                     interval=0.01, on_timeout=lambda: _active_sessions(db))
            jobs = in_flight(db, victim)
            if jobs:
                return jobs
            victim.signal(signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError(f"worker {victim.pid} never had a job in flight\n{victim.output()[-3000:]}")


def test_sigkill_mid_job_loses_nothing_and_doubles_nothing(dsn, effects, producer, spawn):
    db = effects
    ids = producer.enqueue_many([("effect", {"sleep": 0.002}) for _ in range(N_JOBS)])
    workers = [spawn.worker(dsn, concurrency=2) for _ in range(3)]
    victim, survivors = workers[0], workers[1:]

    def done() -> int:
        return scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE state = 'done'")

    wait_for(lambda: scalar(db, "SELECT count(*) FROM effects WHERE pid = %s", [victim.pid]) >= 50, 60,
             "the victim to have done some jobs", on_timeout=victim.output)
    assert done() < N_JOBS - 200, "the queue drained before the kill; nothing would be tested"
    killed_jobs = _freeze_with_jobs_in_flight(db, victim)
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL

    wait_for(lambda: done() == N_JOBS, 120, f"all {N_JOBS} jobs done",
             on_timeout=lambda: str(db.execute("SELECT state, count(*) FROM skiplock.jobs GROUP BY 1").fetchall()))
    for w in survivors:
        w.signal(signal.SIGTERM)
    for w in survivors:
        assert w.wait() == 0, w.output()[-3000:]

    states = dict(db.execute("SELECT state, count(*) FROM skiplock.jobs GROUP BY state").fetchall())
    assert states == {"done": N_JOBS}
    # Every job's effect exists exactly once.
    assert scalar(db, "SELECT count(*) FROM effects") == N_JOBS
    assert db.execute("SELECT job_id, count(*) FROM effects GROUP BY job_id HAVING count(*) <> 1").fetchall() == []
    assert scalar(db, "SELECT count(DISTINCT job_id) FROM effects WHERE job_id = ANY(%s)", [ids]) == N_JOBS
    # The jobs the victim had in flight: its writes rolled back with it, and another worker redid them.
    # None was charged for the kill: a job killed while counted alone shared its process with the
    # victim's other slot (so its next attempt ran alone in its process, the same number again), and a
    # job killed in a batch was never counted (the batch's jobs then ran again alone, each counted once).
    survivor_pids = {w.pid for w in survivors}
    for job_id, kind in killed_jobs.items():
        runs = effects_of(db, job_id)
        assert len(runs) == 1, runs
        attempt, pid = runs[0]
        assert pid in survivor_pids, f"job {job_id}: effect left by pid {pid}, the victim was {victim.pid}"
        job = job_row(db, job_id)
        assert job["state"] == "done" and job["attempts"] == attempt, job
        assert attempt == 1, (kind, job)
    # Finished attempts and committed batches leave no bookkeeping behind; a killed batch's row names
    # only finished jobs now, and pruning removes it.
    assert scalar(db, "SELECT count(*) FROM skiplock.job_attempts") == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.job_batches b WHERE EXISTS "
                      "(SELECT FROM skiplock.jobs j WHERE j.id = ANY(b.ids) AND j.state <> 'done')") == 0
    # All three worked: the kill really happened mid-run.
    pids = {r[0] for r in db.execute("SELECT DISTINCT pid FROM effects").fetchall()}
    assert pids == {w.pid for w in workers}


def test_sigkill_during_a_side_by_side_batch_loses_nothing_and_doubles_nothing(dsn, effects, producer, spawn,
                                                                                tmp_path):
    """A worker killed while a batch's jobs run side by side on its slots (docs/batches.md, "Side by
    side"): their transaction rolls back, and another worker runs each of them once, uncharged."""
    db = effects
    started, hold = tmp_path / "started", tmp_path / "hold"
    victim = spawn.worker(dsn, "--batch-budget", "1", concurrency=8)  # fast: under 250 ms
    # Bursts of 8 quick jobs: the task is measured fast but not near-instant, and the claim size of
    # the permit the next burst's claim takes (the last one given back) grows to 8.
    for _ in range(6):
        warm = producer.enqueue_many([("side", {"started": str(started), "sleep": 0.003})] * 8)
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                                [warm]) == 8, 60, "a warm-up burst done", on_timeout=victim.output)
    hold.touch()
    ids = producer.enqueue_many([("side", {"started": str(started), "hold": str(hold)})] * 8)

    def running_in_victim() -> set[int]:
        lines = [line.split() for line in started.read_text().splitlines()]
        return {int(j) for j, _, pid in lines if int(pid) == victim.pid and int(j) in ids}

    # Several of them started at once in the victim (one holds the connection and waits on `hold`, the
    # others wait for the connection), so none has finished.
    wait_for(lambda: len(running_in_victim()) >= 4, 60, "jobs of one batch running side by side",
             on_timeout=victim.output)
    killed = in_flight(db, victim)
    assert set(running_in_victim()) <= {j for j, kind in killed.items() if kind == "batch"}, killed
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    hold.unlink()
    survivor = spawn.worker(dsn, concurrency=2)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                            [ids]) == 8, 60, "the batch redone", on_timeout=survivor.output)
    for job_id in ids:
        runs = effects_of(db, job_id)  # the victim's effects rolled back with it
        assert runs == [(1, survivor.pid)], (job_id, runs)  # once, by the survivor; the kill charged none
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output()[-3000:]


def test_poison_job_that_kills_its_worker_ends_failed(dsn, effects, spawn):
    db = effects
    enq = run_cli(dsn, "enqueue", "suicide", "--app", "tasks_app:app")
    assert enq.returncode == 0, enq.stderr
    job_id = int(enq.stdout.strip())
    max_attempts = 3
    assert job_row(db, job_id)["max_attempts"] == max_attempts  # the task's default, via --app

    codes = []
    for _ in range(max_attempts + 2):
        w = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
        codes.append(w.wait(timeout=60))
        if codes[-1] == 0:
            break
    assert codes == [-signal.SIGKILL] * max_attempts + [0], codes

    job = job_row(db, job_id)
    assert job["state"] == "failed", job
    assert job["attempts"] == max_attempts
    assert "attempt(s) started and none finished" in job["last_error"], job["last_error"]
    assert job["finished_at"] is not None
    assert effects_of(db, job_id) == []  # every attempt's write died with its worker

    shown = run_cli(dsn, "jobs", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert "failed" in shown.stdout and "none finished" in shown.stdout

    # It stays failed: a later worker does not pick it up (it would be SIGKILLed if it did).
    later = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
    assert later.wait(timeout=60) == 0, later.output()
    after = job_row(db, job_id)
    assert (after["state"], after["attempts"], after["finished_at"]) == ("failed", max_attempts, job["finished_at"])


def test_poison_job_reports_max_attempts_through_the_api(dsn, effects, producer, spawn):
    job_id = producer.enqueue("suicide", max_attempts=1)
    first = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
    assert first.wait(timeout=60) == -signal.SIGKILL
    second = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
    assert second.wait(timeout=60) == 0, second.output()
    job = producer.get_job(job_id)
    assert job.state == "failed"
    assert job.attempts == 1, f"{job.attempts}/{job.max_attempts}"


def test_poison_job_in_a_batch_is_charged_alone_and_its_batch_mates_are_not(dsn, effects, producer, spawn):
    """The poison job kills its worker in the middle of a batch. Nothing of that batch commits, and the
    batch's row stays behind: each of its jobs is then run alone with a counted attempt. The poison job
    crashes each of those until it gives up; its batch-mates are done once, charged one attempt."""
    db = effects
    codes, poison, good = crash_a_batch_until_done(dsn, producer, spawn, concurrency=1)
    # One kill in the batch (not counted), two alone (counted), then the attempt limit.
    assert codes == [-signal.SIGKILL] * 3 + [0], codes
    job = job_row(db, poison)
    assert (job["state"], job["attempts"]) == ("failed", 2), job
    assert "attempt(s) started and none finished" in job["last_error"]
    assert effects_of(db, poison) == []
    rows = db.execute("SELECT id, state, attempts FROM skiplock.jobs WHERE id <> %s ORDER BY id", [poison]).fetchall()
    assert rows == [(i, "done", 1) for i in good]
    assert db.execute("SELECT job_id, count(*) FROM effects GROUP BY 1 HAVING count(*) <> 1").fetchall() == []
    assert scalar(db, "SELECT count(*) FROM effects") == len(good)
    # The dead batches' rows now name only finished jobs: pruning removes them.
    assert scalar(db, "SELECT count(*) FROM skiplock.job_batches") > 0
    producer.prune()
    assert scalar(db, "SELECT count(*) FROM skiplock.job_batches") == 0


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
def test_handler_raising_base_exception_is_recorded_and_worker_carries_on(dsn, effects, producer, spawn, kind):
    db = effects
    # The task retries after 0 s; the producer does not import tasks_app, so max_attempts is given here.
    bad = producer.enqueue("raise_base", {"kind": kind}, max_attempts=2)
    w = spawn.worker(dsn, concurrency=1)

    wait_for(lambda: job_row(db, bad)["state"] == "failed", 30, f"job {bad} to end failed", on_timeout=w.output)
    assert w.alive(), f"the worker died on the handler's {kind}\n{w.output()}"
    job = job_row(db, bad)
    assert job["attempts"] == 2
    assert job["last_error"].startswith(f"{kind}: handler of job {bad}"), job["last_error"]
    assert [e["attempt"] for e in job["errors"]] == [1, 2]  # retried once, then failed
    assert all(e["error"].startswith(kind) for e in job["errors"])
    assert effects_of(db, bad) == []  # each attempt's write rolled back to the savepoint

    # The same worker process keeps serving jobs enqueued afterwards.
    good = producer.enqueue_many([("effect", {}) for _ in range(3)])
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                            [good]) == 3, 30, "the later jobs to be done", on_timeout=w.output)
    assert all(effects_of(db, g) == [(1, w.pid)] for g in good)
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
