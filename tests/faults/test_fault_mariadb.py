"""The fault-injection suite on MariaDB (issue 12, "Tests and CI"): the PostgreSQL scenarios of this
directory, run against the suite's own private MariaDB 10.11 (restarted by the tests) with the same
tasks (faults_tasks.py), the same real ``skiplock worker`` processes and the same invariants, each
adding its row to the summary table printed at the end of the run (scenario names end in "MariaDB").
The shared part (the server, a test's database, the verdict) is mariadb_faults.py; the claimed
lease's SIGSTOP and the misbehaving handlers are test_fault_mariadb_more.py. Sizes are smaller than
PostgreSQL's to keep the suite's time.

- SIGKILL of random workers while four drain the queue, in both lease modes;
- ``KILL CONNECTION`` of the lease session of a job in flight (an operator, a dying proxy);
- a server restart (clean SIGTERM, and SIGKILL: a crash InnoDB recovers from) while 4 workers run,
  then the server down for 2 s: the workers reconnect on their own;
- a stalled network: a worker behind :class:`faults_support.StallProxy` stalls mid-job; MariaDB's
  ``idle_transaction_timeout`` (= ``lease_timeout``, set on every lease session) ends the stale
  transaction, and a healthy worker redoes the job within the stated bound;
- a handler hung past its ``timeout``: the worker's watchdog ends (``KILL``) the lease session; the
  job fails after its two attempts with the reason, nothing of it committed, the worker survives.

Invariants (as :func:`faults_support.verdict`): no job lost, none finished twice (at most one committed
database-local effect), a done job has exactly one effect, a failed one none and says why, no
bookkeeping left behind. The worker's DSN (with its password) goes through ``SKIPLOCK_DSN``, never argv.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from faults_support import StallProxy, executions, record, wait_for
from faults_tasks import HANG_TIMEOUT
from mariadb_faults import Db, maria, mdb, producer  # noqa: F401 - the fixtures

@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_mariadb_sigkill_random_workers_during_a_run(lease: str, mdb: Db, producer: Any) -> None:
    """Claimed lease: a killed worker's jobs stay ``running`` until their lease (2 s) expires and a
    live worker's rescuer (every 0.5 s) returns them; their handlers then run again (at least once)."""
    task = "txn_effect" if lease == "transaction" else "claimed_effect"
    ids = producer.enqueue_many([(task, {"sleep": 0.05}) for _ in range(800)])
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    started = time.monotonic()
    claimed = lease == "claimed"
    running = [mdb.worker(maintenance=claimed) for _ in range(4)]
    killed = []
    while len(killed) < 6 and mdb.unfinished(ids) > 100:
        for wp in running:
            mdb.serving(wp)
        time.sleep(rng.uniform(0.2, 0.5))
        victim = running.pop(rng.randrange(len(running)))
        assert victim.alive(), f"worker {victim.pid} died on its own\n{victim.tail()}"
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
        killed.append(victim)
        running.append(mdb.worker(maintenance=claimed))
    wait_for(lambda: mdb.unfinished(ids) == 0, 120, f"all {len(ids)} jobs to finish",
             on_timeout=lambda: f"{mdb.states(ids)}\n{running[0].tail()}")
    codes = mdb.stop(running)
    v = mdb.verdict(ids)
    killed_pids = {w.pid for w in killed}
    committed = set(mdb.rows(f"SELECT job_id, pid FROM effects WHERE job_id IN ({mdb.ids_in(ids)})"))
    cut_short = {(j, p) for j, _, p in executions(mdb.exec_dir) if p in killed_pids and (j, p) not in committed}
    record("SIGKILL random workers (MariaDB)", lease, v, f"{len(killed)} SIGKILL", time.monotonic() - started,
           note=f"seed {seed}; {len(cut_short)} handler run(s) cut short by a kill")
    assert v.problems() == [], f"seed {seed}: {v.problems()}"
    assert v.states == {"done": len(ids)}, v.states
    assert all(code == 0 for code in codes.values()), codes
    runs_by_pid = Counter(p for _, _, p in executions(mdb.exec_dir))
    assert len(killed) >= 3 and cut_short, (f"seed {seed}: the kills hit no job in flight; handler runs of the killed: "
                                            f"{[runs_by_pid[p] for p in killed_pids]}", killed[0].tail())


def test_mariadb_kill_of_a_worker_session_mid_job(mdb: Db, producer: Any) -> None:
    # 0.3 s jobs: the job read from job_attempts is still the one in that session when KILL arrives
    # 80 jobs on 4 slots: ~6 s of work, so the loop below (a try every 0.2 s) gets its kills in before the
    # queue runs low even when the workers start late (with 40 jobs one CI run got only two)
    ids = producer.enqueue_many([("txn_effect", {"sleep": 0.3}) for _ in range(80)])
    started = time.monotonic()
    procs = [mdb.worker(), mdb.worker()]
    killed: list[int] = []
    deadline = time.monotonic() + 60
    while len(killed) < 5 and time.monotonic() < deadline and mdb.unfinished(ids) > 8:
        # in flight: an attempt counted beyond the (committed) row's, which is still queued -- a finished
        # job's attempt row may linger a moment after its commit
        found = mdb.rows("SELECT a.job_id, a.backend_pid FROM skiplock_job_attempts a "
                         "JOIN skiplock_jobs j ON j.id = a.job_id AND j.state = 'queued' AND a.started > j.attempts "
                         "JOIN information_schema.PROCESSLIST p ON p.ID = a.backend_pid "
                         "WHERE a.started_at < UTC_TIMESTAMP(6) - INTERVAL 50000 MICROSECOND LIMIT 1")
        if found:
            try:
                mdb.rows("KILL CONNECTION %s", (int(found[0][1]),))
                killed.append(int(found[0][0]))
            except Exception:  # noqa: BLE001 - that job finished meanwhile (1094: no such thread)
                pass
        time.sleep(0.2)
    wait_for(lambda: mdb.unfinished(ids) == 0, 90, "every job to finish",
             on_timeout=lambda: f"{mdb.states(ids)}\n" + "\n".join(p.tail() for p in procs))
    alive = [p.alive() for p in procs]
    codes = mdb.stop(procs)
    v = mdb.verdict(ids)
    record("KILL of a worker's session mid-job (MariaDB)", "transaction", v, f"{len(killed)} KILL",
           time.monotonic() - started, note=f"jobs in flight in the killed sessions when read: {killed}")
    assert len(killed) >= 3, killed
    assert alive == [True, True], "\n".join(p.tail() for p in procs)
    assert v.problems() == [], v.problems()
    assert v.states == {"done": len(ids)}, v.states
    assert all(code == 0 for code in codes.values()), codes
    # the kills cut attempts short: those handlers ran again (a KILL racing the job's own COMMIT
    # hits the session's next claim instead, which re-runs nothing -- so not one re-run per KILL)
    assert v.duplicated_executions >= 1, (killed, v)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_mariadb_restart_while_four_workers_run(mode: str, mdb: Db, producer: Any) -> None:
    ids = producer.enqueue_many([("txn_effect", {"sleep": 0.01}) for _ in range(500)])
    producer.close()  # its pooled connections would only die in the restart

    def finished() -> int:
        try:
            return len(ids) - mdb.unfinished(ids)
        except Exception:  # noqa: BLE001 - the server is down
            return 0

    started = time.monotonic()
    procs = [mdb.worker() for _ in range(4)]
    progress = []
    wait_for(lambda: finished() >= len(ids) // 5, 60, "a fifth of the jobs to finish", on_timeout=procs[0].tail)
    progress.append(finished())
    mdb.server.restart(mode)
    wait_for(lambda: finished() >= progress[-1] + len(ids) // 5, 60, "another fifth after the restart",
             on_timeout=lambda: "\n".join(p.tail() for p in procs))
    progress.append(finished())
    mdb.server.halt(mode)
    time.sleep(2.0)  # the fault itself: the server stays down this long
    mdb.server.resume()
    wait_for(lambda: finished() == len(ids), 90, "every job to finish after the restarts",
             on_timeout=lambda: "\n".join(p.tail() for p in procs))
    alive = [p.alive() for p in procs]
    codes = mdb.stop(procs)
    v = mdb.verdict(ids)
    record(f"MariaDB restart ({'SIGTERM' if mode == 'fast' else 'SIGKILL'})", "transaction", v, "2 restarts",
           time.monotonic() - started, note=f"finished before each restart: {progress}")
    assert alive == [True] * 4, "a worker died instead of reconnecting\n" + "\n".join(p.tail() for p in procs)
    assert all(code == 0 for code in codes.values()), (codes, [p.tail() for p in procs])
    assert v.problems() == [], v.problems()
    assert v.states == {"done": len(ids)}, v.states


LEASE_TIMEOUT = 3.0
SLACK = 2.0


def test_mariadb_stalled_network_mid_job(mdb: Db, producer: Any) -> None:
    """The stale worker's transaction is ended by the server (idle_transaction_timeout = lease_timeout)
    within LEASE_TIMEOUT + SLACK of the stall (its session leaves the process list); the healthy worker
    then redoes the job, finished once."""
    proxy = StallProxy(mdb.server.port)
    env = {"FAULTS_LEASE_TIMEOUT": str(LEASE_TIMEOUT)}
    try:
        (job,) = producer.enqueue_many([("txn_effect", {"sleep_first": 2.0})])
        started = time.monotonic()
        stale = mdb.worker(port=proxy.port, concurrency=1, env=env)
        wait_for(lambda: mdb.scalar("SELECT COUNT(*) FROM skiplock_job_attempts WHERE job_id = %s", (job,)) == 1,
                 30, "the job to start behind the proxy", on_timeout=stale.tail)
        lease_session = int(mdb.scalar("SELECT backend_pid FROM skiplock_job_attempts WHERE job_id = %s", (job,)))
        proxy.stall()
        stalled_at = time.monotonic()
        healthy = mdb.worker(concurrency=1, env=env)
        seen: dict[str, float] = {}

        def progress() -> bool:
            # the server's bound is timed on the stale session's end, not on the healthy worker's redo (which
            # adds its process start-up: one CI run on a loaded machine took 7.7 s to the redo)
            if "ended" not in seen and not mdb.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                                                      "WHERE ID = %s", (lease_session,)):
                seen["ended"] = time.monotonic() - stalled_at
            if "redone" not in seen and mdb.scalar("SELECT state FROM skiplock_jobs WHERE id = %s", (job,)) == "done":
                seen["redone"] = time.monotonic() - stalled_at
            return len(seen) == 2

        wait_for(progress, 60, "the stale session to end and the healthy worker to redo the job",
                 on_timeout=lambda: f"{seen}\n" + stale.tail() + healthy.tail(), interval=0.05)
        ended_after, redone_after = seen["ended"], seen["redone"]
        proxy.heal()
        time.sleep(0.5)  # the stale worker meets its ended session (its late writes are refused)
        alive = stale.alive()
        codes = mdb.stop([healthy])
        v = mdb.verdict([job])
        record("stalled network, TCP proxy (MariaDB)", "transaction", v, "1 stall", time.monotonic() - started,
               note=f"stale session ended by the server {ended_after:.1f} s after the stall (bound: lease_timeout "
                    f"{LEASE_TIMEOUT:.0f} s + {SLACK:.0f} s), job done by the healthy worker after {redone_after:.1f} s")
    finally:
        proxy.close()
    assert v.problems() == [], v.problems()
    assert v.states == {"done": 1}
    assert mdb.rows("SELECT pid, attempt FROM effects WHERE job_id = %s", (job,)) == [(healthy.pid, 2)]
    # the server ended the stale transaction (idle_transaction_timeout), not the job's own 2 s first attempt
    assert ended_after < LEASE_TIMEOUT + SLACK, seen
    # the redo came after the stale transaction ended; the session leaves the process list a moment
    # after its rollback freed the row, and both are polled every 50 ms (one CI run saw the redo 0.15 s
    # before the session's exit): the effects above say the job ran once, by the healthy worker
    assert redone_after >= ended_after - 0.5, seen
    assert alive, stale.tail()
    assert all(code == 0 for code in codes.values()), codes


def test_mariadb_hung_handler_past_its_timeout(mdb: Db, producer: Any) -> None:
    normal = producer.enqueue_many([("txn_effect", {"sleep": 0.01}) for _ in range(20)])
    (hung,) = producer.enqueue_many([("txn_hang", {})])
    started = time.monotonic()
    wp = mdb.worker(concurrency=2)
    wait_for(lambda: mdb.unfinished([*normal, hung]) == 0, 60, "the hung job to fail and the others to finish",
             on_timeout=wp.tail)
    alive = wp.alive()
    codes = mdb.stop([wp])
    v = mdb.verdict([*normal, hung])
    state, last_error = mdb.rows("SELECT state, last_error FROM skiplock_jobs WHERE id = %s", (hung,))[0]
    record("hung handler past its timeout (MariaDB)", "transaction", v, f"1 hang > {HANG_TIMEOUT:.0f} s timeout",
           time.monotonic() - started)
    assert alive, wp.tail()
    assert state == "failed" and "timeout" in (last_error or "").lower(), (state, last_error)
    assert v.problems() == [], v.problems()
    assert v.states == {"done": len(normal), "failed": 1}, v.states
    assert all(code == 0 for code in codes.values()), codes
