"""``pg_terminate_backend`` on a worker's lease connection while a job runs on it.

Two worker processes run transaction-lease and claimed-lease jobs side by side; every 0.05-0.2 s the
test picks, in one statement, a random lease session that has a job in flight and terminates it
(eight per lease mode).
Invariants: no job lost; no job finished twice (one committed database-local effect per job, the
terminated attempts' writes rolled back); every job ends ``done``; the workers survive (their slots
reconnect on their own) and exit cleanly on SIGTERM.
"""

from __future__ import annotations

import random
import time

from faults_support import record, scalar, states_of, unfinished, verdict, wait_for

PER_MODE = 250
TERMINATIONS = 8  # per lease mode

# A random lease session with a job in flight, terminated in the same statement (so the pick cannot go
# stale): transaction lease -- the session recorded with the job's started attempt; claimed lease --
# the session of the slot that owns a running job.
TERMINATE_ONE_IN_FLIGHT = """
WITH in_flight AS (
    SELECT s.pid, a.job_id, 'transaction' AS lease
      FROM pg_stat_activity s JOIN skiplock.job_attempts a ON a.backend_pid = s.pid
     WHERE s.application_name LIKE 'skiplock-worker %%'
    UNION ALL
    SELECT s.pid, j.id, 'claimed'
      FROM pg_stat_activity s JOIN skiplock.jobs j ON s.application_name = 'skiplock-worker ' || j.worker
     WHERE j.state = 'running'),
target AS (SELECT * FROM in_flight WHERE lease = %(lease)s ORDER BY random() LIMIT 1)
SELECT pid, job_id, lease, pg_terminate_backend(pid) FROM target
"""


def test_terminate_backend_of_a_worker_mid_job(fdsn, fdb, producer, workers, exec_dir):
    # Interleaved, so both kinds are in flight at once.
    ids = producer.enqueue_many([(task, {"sleep": 0.05}) for _ in range(PER_MODE)
                                 for task in ("txn_effect", "claimed_effect")])
    txn_ids, claimed_ids = ids[0::2], ids[1::2]
    started = time.monotonic()
    procs = [workers.start(fdsn, concurrency=2) for _ in range(2)]
    rng = random.Random()
    hits: list[tuple[int, int, str]] = []
    count = lambda lease: sum(1 for h in hits if h[2] == lease)  # noqa: E731
    deadline = time.monotonic() + 60
    while min(count("transaction"), count("claimed")) < TERMINATIONS and unfinished(fdb, ids) \
            and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.2))
        lease = min(("transaction", "claimed"), key=count)
        row = fdb.execute(TERMINATE_ONE_IN_FLIGHT, {"lease": lease}).fetchone()
        if row is not None and row[3]:
            hits.append((row[0], row[1], row[2]))

    wait_for(lambda: unfinished(fdb, ids) == 0, 90, "every job to finish",
             on_timeout=lambda: f"{states_of(fdb, ids)}\n{procs[0].tail()}")
    alive = [p.alive() for p in procs]
    codes = workers.stop_all(procs, fdb)
    elapsed = time.monotonic() - started

    rerun = [job_id for _, job_id, _ in hits if scalar(fdb, "SELECT attempts FROM skiplock.jobs WHERE id = %s",
                                                          [job_id]) >= 2]
    verdicts = {"transaction": verdict(fdb, txn_ids, exec_dir), "claimed": verdict(fdb, claimed_ids, exec_dir)}
    for lease, v in verdicts.items():
        n = count(lease)
        n_rerun = sum(1 for h in hits if h[2] == lease and h[1] in rerun)
        record("pg_terminate_backend mid-job", lease, v, f"{n} terminated", elapsed,
               note=f"{n_rerun} of the {n} terminated attempt(s) ran again")

    assert count("transaction") == count("claimed") == TERMINATIONS, f"too few in-flight sessions terminated: {hits}"
    assert alive == [True, True], "a worker died instead of reconnecting\n" + "\n".join(p.tail() for p in procs)
    assert all(code == 0 for code in codes.values()), codes
    for lease, v in verdicts.items():
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": PER_MODE}, (lease, v.states)
    logs = "".join(p.output() for p in procs)
    assert "database connection lost" in logs or "connection was lost" in logs, logs[-3000:]
    # The terminated attempts did not count as finished: such a job ran again and committed once. (A
    # termination can land just after a COMMIT, so this holds for nearly every hit, not all of them.)
    assert rerun, f"no termination cut an attempt short: {hits}"
