"""Handlers that misbehave: hang past their timeout, exhaust memory, raise BaseException.

Each bad job runs next to ordinary jobs of both lease modes in a real worker process. Invariants: the
bad job ends ``failed`` after its attempts (2) with its reason recorded (each attempt's, even when an
attempt's session is slow to exit), none of its database-local writes committed; the worker process
survives and the ordinary jobs are each done exactly once; nothing is lost.
"""

from __future__ import annotations

import os
import resource
import signal
import time

import pytest

from faults_support import executions, record, scalar, states_of, unfinished, verdict, wait_for, wait_ready
from faults_tasks import HANG_TIMEOUT

NORMAL_PER_MODE = 20
MEMORY_HEADROOM = 768 << 20  # address space the capped worker may map beyond what it maps when idle


def normal_jobs(producer) -> dict[str, list[int]]:
    ids = producer.enqueue_many([(task, {"sleep": 0.01}) for _ in range(NORMAL_PER_MODE)
                                 for task in ("txn_effect", "claimed_effect")])
    return {"transaction": ids[0::2], "claimed": ids[1::2]}


def job_errors(db, job_id: int) -> tuple[str, str, list[dict]]:
    return db.execute("SELECT state, last_error, errors FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()


def check_bad_job(db, job_id: int, expect: tuple[str, ...], every_attempt: bool = True) -> None:
    """Failed with a reason naming one of ``expect``; with ``every_attempt``, both attempts' errors are
    recorded and each names one of ``expect``; no effect committed."""
    state, last_error, errors = job_errors(db, job_id)
    assert state == "failed", (job_id, state, last_error)
    assert any(x in last_error for x in expect), (job_id, last_error[:500])
    if every_attempt:
        assert [e["attempt"] for e in errors] == [1, 2], errors
        for e in errors:
            assert any(x in e["error"] for x in expect), (job_id, e["error"][:500])
    assert db.execute("SELECT count(*) FROM effects WHERE job_id = %s", [job_id]).fetchone()[0] == 0


def finish(fdb, workers, procs, ids, what: str, timeout: float = 60) -> dict[int, int]:
    wait_for(lambda: unfinished(fdb, ids) == 0, timeout, what,
             on_timeout=lambda: f"{states_of(fdb, ids)}\n" + "\n".join(p.tail() for p in procs))
    alive = [p.alive() for p in procs]
    assert all(alive), "the worker died\n" + "\n".join(p.tail() for p in procs)
    return workers.stop_all(procs, fdb)


def test_handler_hanging_past_its_timeout(fdsn, fdb, producer, workers, exec_dir):
    """A handler stuck in Python (``time.sleep``) or in the database (``pg_sleep``) past its task's
    1 s timeout: the worker abandons it, PostgreSQL ends its transaction, the attempt fails with a
    timeout error, and after two attempts the job is failed. The slot moves on."""
    normal = normal_jobs(producer)
    hang = {"transaction": [producer.enqueue("txn_hang"), producer.enqueue("txn_hang_db")],
            "claimed": [producer.enqueue("claimed_hang")]}
    started = time.monotonic()
    procs = [workers.start(fdsn, concurrency=2)]
    codes = finish(fdb, workers, procs, [i for ids in (*normal.values(), *hang.values()) for i in ids],
                   "the hanging jobs to fail and the others to finish")
    elapsed = time.monotonic() - started
    for lease in ("transaction", "claimed"):
        v = verdict(fdb, normal[lease] + hang[lease], exec_dir, effect_expected=True)
        record("handler hangs past its timeout", lease, v, f"{len(hang[lease])} hang(s) x 2 attempts", elapsed,
               note=f"timeout {HANG_TIMEOUT:g}s")
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": NORMAL_PER_MODE, "failed": len(hang[lease])}, (lease, v.states)
    for job_id in hang["transaction"] + hang["claimed"]:
        # JobTimeout from the worker, or the server's statement/transaction timeout for the handler stuck
        # in pg_sleep; every attempt of either mode is recorded with its reason.
        check_bad_job(fdb, job_id, ("JobTimeout", "statement timeout", "transaction timeout"), every_attempt=True)
    assert codes == {procs[0].pid: 0}, codes


def slot_sessions(fdb, w) -> int:
    return scalar(fdb, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                  [f"skiplock-worker {w.slot_pattern}"])


def outlive_the_timeout(fdb, w, job_id: int, attempt: int, exec_dir) -> None:
    """Attempt ``attempt`` of a hang job run by ``w`` (one slot): once its handler has started, SIGSTOP
    the slot's backend (a backend slow to exit, as on a loaded server: a transaction lease's holds the
    job's row lock longer than the worker's 5 s wait in pg_terminate_backend), until the worker has
    timed the handler out, tried to record the outcome and its slot has reconnected; then let the
    backend exit."""
    wait_for(lambda: (job_id, attempt, w.pid) in executions(exec_dir), 30, f"attempt {attempt} to start",
             on_timeout=w.tail)
    wait_for(lambda: slot_sessions(fdb, w) == 1, 30, "the slot's earlier session to be gone", on_timeout=w.tail)
    backend_pid = scalar(fdb, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                         [f"skiplock-worker {w.slot_pattern}"])
    os.kill(backend_pid, signal.SIGSTOP)
    try:
        # The worker times the handler out, terminates that session, records the outcome, and its slot
        # reconnects: a second lease session of the slot means the outcome write has been made.
        wait_for(lambda: slot_sessions(fdb, w) >= 2, 30, "the slot to move on", on_timeout=w.tail)
    finally:
        os.kill(backend_pid, signal.SIGCONT)


def attempts_and_reasons(errors: list[dict]) -> list[tuple[int, str]]:
    return [(e["attempt"], e["error"].split(":")[0]) for e in errors]


@pytest.mark.parametrize("task", ["txn_hang", "claimed_hang"])
def test_timed_out_attempt_is_recorded_even_if_its_session_is_slow_to_exit(task, fdsn, fdb, producer, workers,
                                                                           exec_dir):
    """Transaction lease: the first attempt's record is skipped (its row is still locked by the stopped
    backend); its timeout error is kept in job_attempts and recorded, before its own, by the second
    attempt's failure record. Claimed lease: the stopped session holds no lock on the job's row (the
    claim committed), so the fenced record is written at once."""
    w = workers.start(fdsn, concurrency=1)
    job_id = producer.enqueue(task)
    outlive_the_timeout(fdb, w, job_id, 1, exec_dir)
    wait_for(lambda: scalar(fdb, "SELECT state FROM skiplock.jobs WHERE id = %s", [job_id]) == "failed", 30,
             "the job to fail", on_timeout=w.tail)
    workers.stop_all([w], fdb)
    state, last_error, errors = job_errors(fdb, job_id)
    assert attempts_and_reasons(errors) == [(1, "JobTimeout"), (2, "JobTimeout")], \
        [(e["attempt"], e["error"][:120]) for e in errors]
    assert last_error.startswith("JobTimeout"), last_error[:200]
    v = verdict(fdb, [job_id], exec_dir)
    assert v.problems() == [] and v.states == {"failed": 1}, (v.problems(), v.states)


@pytest.mark.parametrize("second", ["slow to exit too", "worker SIGKILLed"])
def test_unrecorded_timeout_error_survives_a_second_attempt_whose_session_dies(second, fdsn, fdb, producer, workers,
                                                                                exec_dir):
    """The kept error of attempt 1 leaves job_attempts only with a finishing write that commits. Attempt 2's
    session dies as well, before any write of it commits: its row is still locked when its timeout is
    recorded (then it was the last attempt: the job fails with that timeout, recorded once), or its
    worker is SIGKILLed mid-handler (the next claim finds every attempt used up: 'gave up'). Either way
    attempt 1's timeout is in the job's errors at the end."""
    w = workers.start(fdsn, concurrency=1)
    procs = [w]
    job_id = producer.enqueue("txn_hang")
    outlive_the_timeout(fdb, w, job_id, 1, exec_dir)
    if second == "slow to exit too":
        outlive_the_timeout(fdb, w, job_id, 2, exec_dir)
        expected = [(1, "JobTimeout"), (2, "JobTimeout")]
    else:
        # well inside the handler's 1 s timeout: nothing of attempt 2 is written, its transaction dies
        wait_for(lambda: (job_id, 2, w.pid) in executions(exec_dir), 30, "attempt 2 to start", on_timeout=w.tail)
        w.signal(signal.SIGKILL)
        assert w.wait() == -signal.SIGKILL
        kept = scalar(fdb, "SELECT pending_errors FROM skiplock.job_attempts WHERE job_id = %s", [job_id])
        assert attempts_and_reasons(kept) == [(1, "JobTimeout")], kept
        procs.append(workers.start(fdsn, concurrency=1))
        expected = [(1, "JobTimeout"), (2, "gave up")]
    wait_for(lambda: scalar(fdb, "SELECT state FROM skiplock.jobs WHERE id = %s", [job_id]) == "failed", 30,
             "the job to fail", on_timeout=procs[-1].tail)
    workers.stop_all(procs[-1:], fdb)
    state, last_error, errors = job_errors(fdb, job_id)
    assert attempts_and_reasons(errors) == expected, [(e["attempt"], e["error"][:120]) for e in errors]
    assert last_error.split(":")[0] == expected[-1][1], last_error[:200]
    assert [r for r in executions(exec_dir) if r[0] == job_id and r[1] > 2] == []  # never a third run
    v = verdict(fdb, [job_id], exec_dir)
    assert v.problems() == [] and v.states == {"failed": 1}, (v.problems(), v.states)


def start_capped(workers, fdsn: str, fdb) -> tuple[object, int]:
    """A worker whose address space is capped (RLIMIT_AS, set with prlimit once it is serving) at what
    it maps when idle plus MEMORY_HEADROOM, so a handler eating memory gets MemoryError inside that
    process instead of eating the machine. Returns the worker and its cap."""
    proc = workers.start(fdsn, concurrency=2)
    wait_ready(fdb, proc)
    with open(f"/proc/{proc.pid}/status") as f:
        mapped_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    cap = mapped_kb * 1024 + MEMORY_HEADROOM
    resource.prlimit(proc.pid, resource.RLIMIT_AS, (cap, cap))
    return proc, cap


def test_handler_exhausting_memory(fdsn, fdb, producer, workers, exec_dir):
    """A handler allocating until memory runs out, in a worker capped with RLIMIT_AS (so the fault
    stays inside that process): it gets MemoryError, which is recorded like any failure. Should the
    process die instead, a replacement worker takes over and the job still ends failed with a reason
    (attempts are counted outside the job's transaction). The hog task refuses to run uncapped."""
    normal = normal_jobs(producer)
    started = time.monotonic()
    proc, cap = start_capped(workers, fdsn, fdb)
    procs = [proc]
    hog = {"transaction": [producer.enqueue("txn_hog")], "claimed": [producer.enqueue("claimed_hog")]}
    ids = [i for group in (*normal.values(), *hog.values()) for i in group]
    deaths = 0
    deadline = time.monotonic() + 60
    while unfinished(fdb, ids) and time.monotonic() < deadline:
        if not procs[-1].alive():
            deaths += 1
            assert deaths <= 4, procs[-1].tail()
            procs.append(start_capped(workers, fdsn, fdb)[0])
        time.sleep(0.05)
    codes = finish(fdb, workers, procs[-1:], ids, "every job to finish")
    elapsed = time.monotonic() - started
    for lease in ("transaction", "claimed"):
        v = verdict(fdb, normal[lease] + hog[lease], exec_dir)
        record("handler exhausts memory", lease, v, "1 hog x 2 attempts", elapsed,
               note=f"RLIMIT_AS {cap >> 20} MiB; {deaths} worker death(s)")
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": NORMAL_PER_MODE, "failed": 1}, (lease, v.states)
    for job_id in hog["transaction"] + hog["claimed"]:
        # Where the allocation fails is up to the allocator (normally the hog's own 16 MiB request): each
        # attempt's reason is MemoryError, or -- had the process died -- the attempts-used-up / lease
        # reasons. The MemoryError path must have been taken unless a worker died.
        check_bad_job(fdb, job_id, ("MemoryError", "died or lost its database connection", "lease expired"),
                      every_attempt=False)
        assert deaths or any(e["error"].startswith("MemoryError") for e in job_errors(fdb, job_id)[2])
    assert set(codes.values()) == {0}, codes


@pytest.mark.parametrize("kinds", [("SystemExit", "KeyboardInterrupt", "FaultsBaseException")])
def test_handler_raising_base_exception(kinds, fdsn, fdb, producer, workers, exec_dir):
    """``SystemExit``, ``KeyboardInterrupt`` and a bare ``BaseException`` subclass raised by a handler
    are recorded as the attempt's failure (not re-raised: one bad handler must not take its worker
    down); the job fails after its attempts and the worker carries on."""
    normal = normal_jobs(producer)
    bad = {"transaction": [producer.enqueue("txn_raise_base", {"kind": k}) for k in kinds],
           "claimed": [producer.enqueue("claimed_raise_base", {"kind": k}) for k in kinds]}
    started = time.monotonic()
    procs = [workers.start(fdsn, concurrency=2)]
    codes = finish(fdb, workers, procs, [i for ids in (*normal.values(), *bad.values()) for i in ids],
                   "every job to finish")
    elapsed = time.monotonic() - started
    for lease in ("transaction", "claimed"):
        v = verdict(fdb, normal[lease] + bad[lease], exec_dir)
        record("handler raises BaseException", lease, v, f"{len(kinds)} kinds x 2 attempts", elapsed,
               note=", ".join(kinds))
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": NORMAL_PER_MODE, "failed": len(kinds)}, (lease, v.states)
        for kind, job_id in zip(kinds, bad[lease]):
            check_bad_job(fdb, job_id, (f"{kind}: handler of job {job_id}",))
            assert job_errors(fdb, job_id)[1].startswith(f"{kind}: handler of job {job_id}")
    assert codes == {procs[0].pid: 0}, codes
