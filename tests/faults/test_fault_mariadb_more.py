"""The fault suite on MariaDB, continued (test_fault_mariadb.py has the rest): the claimed lease's
SIGSTOP and the misbehaving handlers, as test_fault_sigstop.py and test_fault_handlers.py do them on
PostgreSQL, with the same tasks, real worker processes, invariants and summary rows ("… (MariaDB)").

- SIGSTOP past the lease, then SIGCONT: worker A starts a claimed-lease job (``lease_seconds`` 1) and
  a transaction-lease job (``lease_timeout`` 2.5 s: MariaDB's ``idle_transaction_timeout`` 2 s), each
  of which would take 1.5 s, and is frozen. Worker B's rescuer returns the claimed job once its lease
  expired, and MariaDB ends A's idle lease transaction; B redoes both. When A resumes, its fenced
  finishing write of the claimed job is refused (A logs that it lost its lease) and its
  transaction-lease attempt fails on its ended session: both jobs stay done by B, each effect once.
- a handler exhausting memory in a worker capped with RLIMIT_AS: MemoryError, recorded like any
  failure; the job fails after its 2 attempts, the worker survives (or a replacement takes over).
- a handler raising SystemExit, KeyboardInterrupt or a bare BaseException subclass: the attempt's
  failure, never the worker's end.
"""

from __future__ import annotations

import json
import resource
import signal
import time
from typing import Any

import pytest

from faults_support import executions, record, wait_for
from mariadb_faults import Db, WorkerProc, maria, mdb, producer  # noqa: F401 - the fixtures

ENV = {"FAULTS_LEASE_TIMEOUT": "2.5", "FAULTS_LEASE_SECONDS": "1", "FAULTS_RESCUE_INTERVAL": "0.5"}
JOB_SECONDS = 1.5  # the first attempt's work: within both leases, had A not been paused
NORMAL_PER_MODE = 20
MEMORY_HEADROOM = 768 << 20  # address space the capped worker may map beyond what it maps when idle


def results(mdb: Db, ids: list[int]) -> dict[int, Any]:
    return {int(i): json.loads(r) for i, r in mdb.rows(f"SELECT id, result FROM skiplock_jobs WHERE id IN ({mdb.ids_in(ids)})")}


def test_mariadb_sigstop_past_the_lease_then_sigcont(mdb: Db, producer: Any) -> None:
    a = mdb.worker(concurrency=2, env=ENV, maintenance=True)
    mdb.serving(a)
    claimed_id = producer.enqueue("claimed_effect", {"sleep_first": JOB_SECONDS})
    txn_id = producer.enqueue("txn_effect", {"sleep_first": JOB_SECONDS})
    ids = [claimed_id, txn_id]
    started = time.monotonic()
    wait_for(lambda: {j for j, _, p in executions(mdb.exec_dir) if p == a.pid} == set(ids), 30,
             "worker A to start both jobs", on_timeout=a.tail)
    a.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        b = mdb.worker(concurrency=2, env=ENV, maintenance=True)
        wait_for(lambda: mdb.states(ids) == {"done": 2}, 30, "worker B to redo both jobs while A is frozen",
                 on_timeout=lambda: f"{mdb.states(ids)}\n{b.tail()}")
        redone_after = time.monotonic() - stopped_at
        assert a.alive()
        done_by = results(mdb, ids)
    finally:
        a.signal(signal.SIGCONT)

    wait_for(lambda: f"job {claimed_id}: lost its lease" in a.output(), 30,
             "A's stale finishing write to be refused", on_timeout=a.tail)
    # the transaction lease, by timing: A's slot meets its session ended by MariaDB at its finishing
    # write and reconnects, or A's watchdog ends the over-long lease first and the attempt fails
    wait_for(lambda: "reconnected to the database" in a.output() or f"job {txn_id} (txn_effect) attempt 1/" in a.output(),
             30, "A's transaction-lease slot to meet its ended session", on_timeout=a.tail)
    after = results(mdb, ids)
    assert after == done_by == {claimed_id: {"pid": b.pid, "attempt": 2}, txn_id: {"pid": b.pid, "attempt": 1}}, \
        (after, done_by)  # nothing changed by A's late writes

    # A carries on: both workers share a few more jobs.
    more = producer.enqueue_many([(t, {"sleep": 0.02}) for _ in range(20) for t in ("txn_effect", "claimed_effect")])
    wait_for(lambda: mdb.unfinished(more) == 0, 60, "the later jobs", on_timeout=lambda: a.tail() + b.tail())
    a_alive = a.alive()
    codes = mdb.stop([a, b])
    elapsed = time.monotonic() - started

    for lease, first, later in (("claimed", claimed_id, more[1::2]), ("transaction", txn_id, more[0::2])):
        v = mdb.verdict([first, *later])
        record("SIGSTOP past the lease, then SIGCONT (MariaDB)", lease, v, "1 SIGSTOP", elapsed,
               note=f"redone by another worker {redone_after:.1f}s after the pause")
        assert v.problems() == [] and v.states == {"done": 1 + len(later)}, (lease, v.problems(), v.states)
    # Each paused job ran twice (A, then B) and was finished once, by B, with B's writes only. The
    # claimed-lease job's attempt was counted at its claim; the transaction-lease one's was not charged.
    runs = sorted((j, att, p) for j, att, p in executions(mdb.exec_dir) if j in ids)
    assert runs == sorted([(claimed_id, 1, a.pid), (claimed_id, 2, b.pid), (txn_id, 1, a.pid), (txn_id, 1, b.pid)])
    assert mdb.rows(f"SELECT job_id, attempt, pid FROM effects WHERE job_id IN ({mdb.ids_in(ids)}) ORDER BY job_id") \
        == sorted([(claimed_id, 2, b.pid), (txn_id, 1, b.pid)])
    assert "lease expired" in str(mdb.job_errors(claimed_id)[2])
    assert a_alive, a.tail()
    assert codes == {a.pid: 0, b.pid: 0}, (codes, a.tail())


def normal_jobs(producer: Any) -> dict[str, list[int]]:
    ids = producer.enqueue_many([(task, {"sleep": 0.01}) for _ in range(NORMAL_PER_MODE)
                                 for task in ("txn_effect", "claimed_effect")])
    return {"transaction": ids[0::2], "claimed": ids[1::2]}


def check_bad_job(mdb: Db, job_id: int, expect: tuple[str, ...], every_attempt: bool = True) -> None:
    """Failed with a reason naming one of ``expect``; with ``every_attempt``, both attempts' errors are
    recorded and each names one of ``expect``; no effect committed."""
    state, last_error, errors = mdb.job_errors(job_id)
    assert state == "failed", (job_id, state, last_error)
    assert any(x in last_error for x in expect), (job_id, last_error[:500])
    if every_attempt:
        assert [e["attempt"] for e in errors] == [1, 2], errors
        for e in errors:
            assert any(x in e["error"] for x in expect), (job_id, e["error"][:500])
    assert mdb.scalar("SELECT COUNT(*) FROM effects WHERE job_id = %s", (job_id,)) == 0


def start_capped(mdb: Db) -> tuple[WorkerProc, int]:
    """A worker (rescuer on) whose address space is capped (RLIMIT_AS, set with prlimit once it is
    serving) at what it maps when idle plus MEMORY_HEADROOM, so a handler eating memory gets
    MemoryError inside that process instead of eating the machine."""
    proc = mdb.worker(concurrency=2, maintenance=True)
    mdb.serving(proc)
    with open(f"/proc/{proc.pid}/status") as f:
        mapped_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    cap = mapped_kb * 1024 + MEMORY_HEADROOM
    resource.prlimit(proc.pid, resource.RLIMIT_AS, (cap, cap))
    return proc, cap


def test_mariadb_handler_exhausting_memory(mdb: Db, producer: Any) -> None:
    normal = normal_jobs(producer)
    started = time.monotonic()
    proc, cap = start_capped(mdb)
    procs = [proc]
    hog = {"transaction": [producer.enqueue("txn_hog")], "claimed": [producer.enqueue("claimed_hog")]}
    ids = [i for group in (*normal.values(), *hog.values()) for i in group]
    deaths = 0
    deadline = time.monotonic() + 90
    while mdb.unfinished(ids) and time.monotonic() < deadline:
        if not procs[-1].alive():
            deaths += 1
            assert deaths <= 4, procs[-1].tail()
            procs.append(start_capped(mdb)[0])
        time.sleep(0.05)
    assert mdb.unfinished(ids) == 0, (mdb.states(ids), procs[-1].tail())
    assert procs[-1].alive(), procs[-1].tail()
    codes = mdb.stop(procs[-1:])
    elapsed = time.monotonic() - started
    for lease in ("transaction", "claimed"):
        v = mdb.verdict(normal[lease] + hog[lease])
        record("handler exhausts memory (MariaDB)", lease, v, "1 hog x 2 attempts", elapsed,
               note=f"RLIMIT_AS {cap >> 20} MiB; {deaths} worker death(s)")
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": NORMAL_PER_MODE, "failed": 1}, (lease, v.states)
    for job_id in hog["transaction"] + hog["claimed"]:
        check_bad_job(mdb, job_id, ("MemoryError", "died or lost its database connection", "lease expired"),
                      every_attempt=False)
        assert deaths or any(e["error"].startswith("MemoryError") for e in mdb.job_errors(job_id)[2])
    assert set(codes.values()) == {0}, codes


@pytest.mark.parametrize("kinds", [("SystemExit", "KeyboardInterrupt", "FaultsBaseException")])
def test_mariadb_handler_raising_base_exception(kinds: tuple[str, ...], mdb: Db, producer: Any) -> None:
    normal = normal_jobs(producer)
    bad = {"transaction": [producer.enqueue("txn_raise_base", {"kind": k}) for k in kinds],
           "claimed": [producer.enqueue("claimed_raise_base", {"kind": k}) for k in kinds]}
    ids = [i for group in (*normal.values(), *bad.values()) for i in group]
    started = time.monotonic()
    wp = mdb.worker(concurrency=2, maintenance=True)
    wait_for(lambda: mdb.unfinished(ids) == 0, 60, "every job to finish",
             on_timeout=lambda: f"{mdb.states(ids)}\n{wp.tail()}")
    assert wp.alive(), wp.tail()
    codes = mdb.stop([wp])
    elapsed = time.monotonic() - started
    for lease in ("transaction", "claimed"):
        v = mdb.verdict(normal[lease] + bad[lease])
        record("handler raises BaseException (MariaDB)", lease, v, f"{len(kinds)} kinds x 2 attempts", elapsed,
               note=", ".join(kinds))
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": NORMAL_PER_MODE, "failed": len(kinds)}, (lease, v.states)
        for kind, job_id in zip(kinds, bad[lease]):
            check_bad_job(mdb, job_id, (f"{kind}: handler of job {job_id}",))
            assert mdb.job_errors(job_id)[1].startswith(f"{kind}: handler of job {job_id}")
    assert codes == {wp.pid: 0}, codes
