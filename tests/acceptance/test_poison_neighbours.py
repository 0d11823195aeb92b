"""One poison job, one victim: a handler that SIGKILLs its worker process does not charge an attempt to
the jobs that were running in the other slots of that process. They run again (each alone in its
process first) and end done; the poison job is charged for every crash it had to itself and ends
failed within max_attempts + 1 runs."""

from __future__ import annotations

import signal

from acceptance_support import effects_of, in_flight, job_row, scalar, wait_for, crash_a_batch_until_done


def test_a_poison_job_does_not_charge_the_jobs_in_the_other_slots(dsn, effects, producer, spawn):
    db = effects
    # three slow innocent jobs with a single attempt each: one charged attempt would fail them
    innocents = producer.enqueue_many([("slow", {"seconds": 3, "first_attempt_only": True}, {"max_attempts": 1})] * 3)
    first = spawn.worker(dsn, concurrency=4)
    wait_for(lambda: len(in_flight(db, first)) == 3, 60, "the 3 innocent jobs to be running", on_timeout=first.output)
    poison = producer.enqueue("suicide", max_attempts=2)  # the fourth slot takes it, and dies with the process
    assert first.wait(timeout=60) == -signal.SIGKILL, first.output()
    assert set(in_flight(db, first)) == {*innocents, poison}  # all four were in flight when it died

    codes = [-signal.SIGKILL]
    for _ in range(5):
        w = spawn.worker(dsn, concurrency=4, stop_when_empty=True)
        codes.append(w.wait(timeout=90))
        if codes[-1] == 0:
            break
    # the shared crash charged nobody; the poison job then ran alone in its process: two charged crashes,
    # then its attempts were used up
    assert codes == [-signal.SIGKILL] * 3 + [0], codes

    for job_id in innocents:
        job = job_row(db, job_id)
        assert (job["state"], job["attempts"]) == ("done", 1), job
        assert effects_of(db, job_id)[0][0] == 1 and len(effects_of(db, job_id)) == 1
    job = job_row(db, poison)
    assert (job["state"], job["attempts"]) == ("failed", 2), job
    assert "attempt(s) started and none finished" in job["last_error"], job["last_error"]
    assert effects_of(db, poison) == []
    assert scalar(db, "SELECT count(*) FROM skiplock.job_attempts") == 0


def test_a_poison_job_in_a_batch_of_a_two_slot_worker_ends_failed_within_max_attempts_plus_one_runs(
        dsn, effects, producer, spawn):
    """The batch that dies charges none of its jobs; each of them then runs alone in its process (its
    batch died), so the poison job's crashes from then on are its own and charged."""
    db = effects
    codes, poison, good = crash_a_batch_until_done(dsn, producer, spawn, concurrency=2)
    assert codes == [-signal.SIGKILL] * 3 + [0], codes  # one uncharged crash, two charged, then failed
    job = job_row(db, poison)
    assert (job["state"], job["attempts"]) == ("failed", 2), job
    rows = db.execute("SELECT id, state, attempts FROM skiplock.jobs WHERE id <> %s ORDER BY id", [poison]).fetchall()
    assert rows == [(i, "done", 1) for i in good]
    assert db.execute("SELECT job_id, count(*) FROM effects GROUP BY 1 HAVING count(*) <> 1").fetchall() == []
