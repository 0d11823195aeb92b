"""A CLI worker and signals: the first SIGTERM/SIGINT drains (the in-flight job finishes, nothing new is
claimed, exit 0); a second one aborts (the in-flight transaction rolls back, the job stays queued,
exit 1), and the job is later done exactly once by another worker."""

from __future__ import annotations

import re
import signal
import time

import pytest

from acceptance_support import effects_of, in_flight, job_row, scalar, wait_for


def test_sigterm_finishes_the_in_flight_job_and_claims_nothing_more(dsn, effects, producer, spawn):
    db = effects
    slow_id, behind_id = producer.enqueue_many([("slow", {"seconds": 2}), ("effect", {})])
    w = spawn.worker(dsn, concurrency=1)

    wait_for(lambda: list(in_flight(db, w)) == [slow_id], 30, f"worker to start job {slow_id}", on_timeout=w.output)
    w.signal(signal.SIGTERM)
    # Read after the signal was sent: the job (and its effect) had not committed yet, so it was in flight.
    assert job_row(db, slow_id)["state"] == "queued" and effects_of(db, slow_id) == []
    rc = w.wait()

    log = w.output()
    assert rc == 0, log
    assert "received SIGTERM" in log
    assert "Traceback" not in log, log
    slow = job_row(db, slow_id)
    assert slow["state"] == "done", slow
    assert slow["attempts"] == 1
    assert effects_of(db, slow_id) == [(1, w.pid)]
    # The job queued behind it was never started: not claimed, no attempt counted, no effect.
    behind = job_row(db, behind_id)
    assert behind["state"] == "queued", behind
    assert behind["attempts"] == 0 and behind["started_at"] is None
    assert scalar(db, "SELECT count(*) FROM skiplock.job_attempts WHERE job_id = %s", [behind_id]) == 0
    assert effects_of(db, behind_id) == []


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["then-SIGINT", "then-SIGTERM"])
def test_second_signal_aborts_and_the_job_is_redone_exactly_once(dsn, effects, producer, spawn, second):
    db = effects
    # Sleeps far longer than the test may wait, but only on its first attempt.
    job_id = producer.enqueue("slow", {"seconds": 120, "first_attempt_only": True})
    w = spawn.worker(dsn, concurrency=1)

    wait_for(lambda: list(in_flight(db, w)) == [job_id], 30, f"worker to start job {job_id}", on_timeout=w.output)
    w.signal(signal.SIGTERM)
    wait_for(lambda: "received SIGTERM" in w.stderr(), 30, "the worker to log the first signal",
             on_timeout=w.output)
    assert w.alive(), "the first signal must not end the worker while its job runs"
    w.signal(second)
    # Prompt: the worker does not wait for the 120 s handler (the timeout is the failure, not a speed bar).
    rc = w.wait(timeout=30)

    log = w.output()
    assert rc == 1, f"an aborted worker exits 1, got {rc}\n{log}"
    assert "aborting 1 in-flight job" in log, log
    assert "Traceback" not in log, log
    job = job_row(db, job_id)
    assert job["state"] == "queued", job  # rolled back: back in the queue, not done
    assert job["finished_at"] is None
    assert effects_of(db, job_id) == []  # the handler's write rolled back with the lease
    assert scalar(db, "SELECT started FROM skiplock.job_attempts WHERE job_id = %s", [job_id]) == 1

    # The aborted lease's session was terminated (waited for, up to 5 s): once it is gone, so is its
    # row lock. A worker told to stop when empty stops at its first claim that finds nothing, so wait
    # for that before starting it (seen once in CI: the second worker found nothing and left the job).
    wait_for(lambda: db.execute("SELECT id FROM skiplock.jobs WHERE id = %s FOR UPDATE SKIP LOCKED",
                                [job_id]).fetchall(), 30, "the aborted lease's lock to be released")
    again = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
    assert again.wait(timeout=60) == 0, again.output()
    job = job_row(db, job_id)
    # (failed once in CI, job queued and the second worker gone with exit 0, not reproduced in 15 runs:
    # all a failure knows is printed)
    assert job["state"] == "done", (
        f"{job}\nattempts: {db.execute('SELECT * FROM skiplock.job_attempts').fetchall()}\n"
        f"batches: {db.execute('SELECT * FROM skiplock.job_batches').fetchall()}\nnow: "
        f"{scalar(db, 'SELECT now()')}\nfirst worker:\n{log}\nsecond worker:\n{again.output()}")
    assert job["attempts"] == 2
    assert effects_of(db, job_id) == [(2, again.pid)]  # exactly once, by the fresh worker


def test_finished_at_is_when_the_job_finished(dsn, effects, producer, spawn):
    db = effects
    job_id = producer.enqueue("slow", {"seconds": 0.5})
    w = spawn.worker(dsn, concurrency=1, stop_when_empty=True)
    assert w.wait() == 0, w.output()
    job = job_row(db, job_id)
    assert job["state"] == "done"
    assert job["finished_at"] >= job["started_at"], job


def test_sigusr1_writes_every_threads_stack_and_the_worker_goes_on(dsn, effects, producer, spawn):
    db = effects
    # 6 s: a dump must catch the handler running, however slowly the loaded machine runs the signals
    job_id = producer.enqueue("slow", {"seconds": 6})
    w = spawn.worker(dsn, concurrency=2)
    wait_for(lambda: list(in_flight(db, w)) == [job_id], 30, f"worker to start job {job_id}", on_timeout=w.output)
    # the dump: one block per thread; the running handler's frame is in one of them. The
    # job's lease is in flight before its handler starts: signal again until a dump catches it.
    in_slow = re.compile(r'tasks_app\.py", line \d+ in slow')

    def dumped_in_slow() -> bool:
        w.signal(signal.SIGUSR1)
        time.sleep(0.2)
        return bool(in_slow.search(w.stderr()))

    wait_for(dumped_in_slow, 30, "the stacks in the worker's log", on_timeout=w.output)
    assert w.stderr().count("Thread 0x") >= 2
    assert w.alive(), "SIGUSR1 must not end the worker"
    wait_for(lambda: job_row(db, job_id)["state"] == "done", 30, "the job to finish after the dump",
             on_timeout=w.output)
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
