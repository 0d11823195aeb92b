"""SIGKILL of worker processes at random moments during a run of thousands of jobs.

Four worker processes (two slots each) drain the queue while a loop SIGKILLs a random one and starts a
replacement, twelve times per lease mode: each kill comes 0.2-0.5 s after the previous replacement is
serving, so four workers are busy at every kill (on a loaded two-core machine a new worker takes about a
second to start; killing faster than that would only kill workers still starting). The queue is topped
up during the loop so that every kill lands in a busy run. Invariants, per lease mode:

- transaction lease: no job lost, every job ``done`` exactly once, and its database-local effect
  committed exactly once (the killed attempts' writes rolled back with their transactions);
- claimed lease: no job lost, every job ``done`` exactly once with exactly one committed effect (its
  writes commit with the fenced finishing write); the handlers of jobs in flight at a kill ran again
  once the rescuer returned them (at least once), which the summary reports as re-executions.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from faults_support import executions, record, serving_pids, states_of, unfinished, verdict, wait_for

FIRST_BATCH = 1500
TOP_UP = 500  # added whenever fewer than this many jobs are unfinished during the kill loop
MAX_JOBS = 6000
KILLS = 12  # per lease mode
SLOTS = 2
N_WORKERS = 4


@pytest.mark.parametrize("lease,queues", [("transaction", None), ("claimed", None), ("transaction", "a,b,c")],
                         ids=["transaction", "claimed", "transaction-named-queues"])
def test_sigkill_random_workers_during_a_run(lease, queues, fdsn, fdb, producer, workers, exec_dir):
    """``queues``: workers of those named queues, the jobs spread over them (the merged claim of
    several queues, `claim_of_queues_merged`), and a backlog of another queue they never take."""
    task = "txn_effect" if lease == "transaction" else "claimed_effect"
    names = queues.split(",") if queues else ["default"]
    extra = ["--queues", queues] if queues else []
    if queues:
        producer.enqueue_many([(task, {"sleep": 0.01}, {"queue": "other"}) for _ in range(300)])

    def enqueue(n: int) -> list[int]:
        return producer.enqueue_many([(task, {"sleep": 0.01}, {"queue": names[i % len(names)]}) for i in range(n)])

    ids = enqueue(FIRST_BATCH)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    started = time.monotonic()
    running = [workers.start(fdsn, concurrency=SLOTS, extra=extra) for _ in range(N_WORKERS)]
    killed = []
    while len(killed) < KILLS:
        wait_for(lambda: {w.pid for w in running} <= serving_pids(fdb), 30, "every worker to be serving",
                 on_timeout=lambda: "\n".join(w.tail() for w in running))
        time.sleep(rng.uniform(0.2, 0.5))
        victim = running.pop(rng.randrange(len(running)))
        assert victim.alive(), f"worker {victim.pid} died on its own\n{victim.tail()}"
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
        killed.append(victim)
        running.append(workers.start(fdsn, concurrency=SLOTS, extra=extra))
        if len(killed) < KILLS and len(ids) < MAX_JOBS and unfinished(fdb, ids) < TOP_UP:
            ids += enqueue(TOP_UP)
    remaining_at_last_kill = unfinished(fdb, ids)

    wait_for(lambda: unfinished(fdb, ids) == 0, 120, f"all {len(ids)} jobs to finish",
             on_timeout=lambda: f"{states_of(fdb, ids)}\n{running[0].tail()}")
    codes = workers.stop_all(running, fdb)
    elapsed = time.monotonic() - started

    v = verdict(fdb, ids, exec_dir)
    killed_pids = {w.pid for w in killed}
    # Handler runs cut short by a kill: started in a killed process, whose effect did not commit there.
    committed = set(fdb.execute("SELECT job_id, pid FROM effects WHERE job_id = ANY(%s)", [ids]).fetchall())
    cut_short = {(j, p) for j, _, p in executions(exec_dir) if p in killed_pids and (j, p) not in committed}
    record("SIGKILL random workers", lease + (f" (queues {queues})" if queues else ""), v, f"{len(killed)} SIGKILL", elapsed,
           note=f"seed {seed}; {len(cut_short)} handler run(s) cut short by a kill; {remaining_at_last_kill} "
                "job(s) still unfinished at the last kill")

    assert v.problems() == [], f"seed {seed}: {v.problems()}"
    assert v.states == {"done": len(ids)}, v.states
    if queues:  # the other queue's jobs: never taken by a worker of the named ones
        assert fdb.execute("SELECT state, count(*) FROM skiplock.jobs WHERE queue = 'other' GROUP BY state"
                           ).fetchall() == [("queued", 300)]
    assert all(code == 0 for code in codes.values()), codes
    # The kills really hit jobs in flight (otherwise nothing was tested), and each such job ran again.
    assert cut_short, f"seed {seed}: no kill hit a job in flight"
    assert v.duplicated_executions >= len({j for j, _ in cut_short})
