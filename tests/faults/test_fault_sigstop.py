"""A worker paused (SIGSTOP) past its lease, then resumed (SIGCONT).

Worker A starts one claimed-lease job (``lease_seconds`` 1) and one transaction-lease job
(``lease_timeout`` 2.5 s), each of which would finish in 1.5 s; A is then frozen. Worker B starts.

- claimed lease: A's heartbeats stop, the lease expires, B's rescuer puts the job back and B runs it
  again (a second execution: at least once) and finishes it. When A resumes, its handler finishes and
  its fenced finishing write is refused (A logs that it lost its lease, a ``LeaseLost`` outcome): the
  job stays done by B with B's result, finished exactly once.
- transaction lease: the server ends A's lease transaction after ``lease_timeout`` idle, B redoes the
  job; when A resumes, its completion fails on the dead connection. Done once, effect once. A's
  attempt never finished and shared A with another job, so it is not charged: B runs it as attempt 1
  again (alone in B: see docs/guarantees.md).

Afterwards A keeps working: both workers drain a few more jobs, each done exactly once.
"""

from __future__ import annotations

import signal
import time

from faults_support import executions, record, scalar, states_of, unfinished, verdict, wait_for

ENV = {"FAULTS_LEASE_TIMEOUT": "2.5", "FAULTS_LEASE_SECONDS": "1", "FAULTS_RESCUE_INTERVAL": "0.5"}
JOB_SECONDS = 1.5  # the first attempt's work: within both leases, had A not been paused


def test_sigstop_worker_past_its_lease_then_resume(fdsn, fdb, producer, workers, exec_dir):
    a = workers.start(fdsn, concurrency=2, env=ENV)
    claimed_id = producer.enqueue("claimed_effect", {"sleep_first": JOB_SECONDS})
    txn_id = producer.enqueue("txn_effect", {"sleep_first": JOB_SECONDS})
    ids = [claimed_id, txn_id]
    started = time.monotonic()
    wait_for(lambda: {j for j, _, p in executions(exec_dir) if p == a.pid} == set(ids), 30,
             "worker A to start both jobs", on_timeout=a.tail)
    a.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        b = workers.start(fdsn, concurrency=2, env=ENV)
        wait_for(lambda: scalar(fdb, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                                [ids]) == 2, 30, "worker B to redo both jobs while A is frozen",
                 on_timeout=lambda: f"{states_of(fdb, ids)}\n{b.tail()}")
        redone_after = time.monotonic() - stopped_at
        assert a.alive()
        done_by = dict(fdb.execute("SELECT id, result FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall())
    finally:
        a.signal(signal.SIGCONT)

    wait_for(lambda: f"job {claimed_id}: lost its lease" in a.output(), 30,
             "A's stale finishing write to be refused", on_timeout=a.tail)
    wait_for(lambda: "reconnected to the database" in a.output(), 30,
             "A's transaction-lease slot to find its session ended and reconnect", on_timeout=a.tail)
    # Nothing changed by A's late writes.
    after = dict(fdb.execute("SELECT id, result FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall())
    assert after == done_by == {claimed_id: {"pid": b.pid, "attempt": 2}, txn_id: {"pid": b.pid, "attempt": 1}}, \
        (after, done_by)

    # A carries on: both workers share a few more jobs.
    more = producer.enqueue_many([(t, {"sleep": 0.02}) for _ in range(20) for t in ("txn_effect", "claimed_effect")])
    wait_for(lambda: unfinished(fdb, more) == 0, 60, "the later jobs", on_timeout=lambda: a.tail() + b.tail())
    a_alive = a.alive()
    codes = workers.stop_all([a, b], fdb)
    elapsed = time.monotonic() - started

    for lease, first, later in (("claimed", claimed_id, more[1::2]), ("transaction", txn_id, more[0::2])):
        v = verdict(fdb, [first, *later], exec_dir)
        record("SIGSTOP past the lease, then SIGCONT", lease, v, "1 SIGSTOP", elapsed,
               note=f"redone by another worker {redone_after:.1f}s after the pause")
        assert v.problems() == [] and v.states == {"done": 1 + len(later)}, (lease, v.problems(), v.states)
    # Each paused job ran twice (A, then B) and was finished once, by B, with B's writes only. The
    # claimed-lease job's attempt was counted at its claim; the transaction-lease one's was not charged.
    runs = sorted((j, att, p) for j, att, p in executions(exec_dir) if j in ids)
    assert runs == sorted([(claimed_id, 1, a.pid), (claimed_id, 2, b.pid), (txn_id, 1, a.pid), (txn_id, 1, b.pid)])
    assert fdb.execute("SELECT job_id, attempt, pid FROM effects WHERE job_id = ANY(%s) ORDER BY job_id",
                       [ids]).fetchall() == sorted([(claimed_id, 2, b.pid), (txn_id, 1, b.pid)])
    errors = scalar(fdb, "SELECT errors::text FROM skiplock.jobs WHERE id = %s", [claimed_id])
    assert "lease expired" in errors, errors
    assert a_alive, a.tail()
    assert codes == {a.pid: 0, b.pid: 0}, (codes, a.tail())
