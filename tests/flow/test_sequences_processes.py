"""Sequences across real worker processes (docs/flow-control.md, "Sequences"): 100 sequences x 20 jobs
(task ``seq_step`` of flow_app.py: ``sequence_by="seq"``, random handler failures retried at once),
drained by three worker processes of four slots while workers are SIGKILLed again and again -- for
both lease modes. Each attempt's start is recorded on an autocommit connection (it survives the
attempt's rollback), each success's end with the job's completion (``job.conn``), both from the
database's clock. Then: every start of job n+1 of a sequence came after job n's successful end (so a
sequence's jobs start strictly in enqueue order and never two at once, retries and kills included),
and every job ended done exactly once (none lost, none run to completion twice)."""

from __future__ import annotations

import random
import signal
from typing import Any

import psycopg
import pytest
from support import wait_for

import skiplock

SEQUENCES, PER_SEQUENCE, KILLS = 100, 20, 4
JOBS = SEQUENCES * PER_SEQUENCE


@pytest.fixture
def seq_tables(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db.execute("CREATE TABLE seq_starts (job_id bigint NOT NULL, seq text NOT NULL, n int NOT NULL, attempt int NOT NULL, "
               "started timestamptz NOT NULL, pid int NOT NULL)")
    db.execute("CREATE TABLE seq_done (job_id bigint NOT NULL, seq text NOT NULL, n int NOT NULL, "
               "ended timestamptz NOT NULL, pid int NOT NULL)")
    return db


def done(db: psycopg.Connection[Any]) -> int:
    return db.execute("SELECT count(*) FROM seq_done").fetchone()[0]


def progress(db: psycopg.Connection[Any], workers: list[Any]) -> str:
    states = db.execute("SELECT state, count(*), max(attempts) FROM skiplock.jobs GROUP BY 1").fetchall()
    return f"jobs (state, count, max attempts): {states}\n{workers[-1].output()[-3000:]}"


def drained(db: psycopg.Connection[Any]) -> bool:
    return db.execute("SELECT count(*) FROM skiplock.jobs WHERE state <> 'done'").fetchone()[0] == 0


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_sequences_run_in_order_one_at_a_time_through_failures_and_kills(
        dsn: str, seq_tables: psycopg.Connection[Any], spawn: Any, lease: str) -> None:
    db = seq_tables
    with skiplock.App(dsn) as producer:
        # interleaved: job n of every sequence before job n+1 of any, so the sequences run side by side
        # (a producer without the task registered gives the key itself: sequence_by is applied at enqueue,
        # and so is the task's max_attempts -- without it the default 5 could run out under 10 % random
        # failures plus kills, and a job would end failed: a flake, not a broken order)
        producer.enqueue_many([("seq_step", {"seq": f"s{s}", "n": n},
                                {"queue": "seq", "sequence": f"s{s}", "max_attempts": 1000})
                               for n in range(PER_SEQUENCE) for s in range(SEQUENCES)])
    env = {"FLOW_DSN": dsn, "FLOW_SECONDS": "0.01", "FLOW_FAIL_RATE": "0.1"}
    workers = [spawn.worker(dsn, concurrency=4, lease=lease, queues=("seq",), env=env) for _ in range(3)]
    rng = random.Random(14)
    for k in range(KILLS):
        target = (k + 1) * JOBS // (KILLS + 2)
        wait_for(lambda: done(db) >= target, timeout=120, what=f"{target} jobs done before kill {k + 1}",
                 on_timeout=lambda: progress(db, workers))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.signal(signal.SIGKILL)
        victim.wait()
        workers.append(spawn.worker(dsn, concurrency=4, lease=lease, queues=("seq",), env=env))
    wait_for(lambda: drained(db), timeout=240, what="every job done",
             on_timeout=lambda: progress(db, workers))

    # none lost, none completed twice: one success per job, every job done
    assert db.execute("SELECT count(*), count(DISTINCT job_id) FROM seq_done").fetchone() == (JOBS, JOBS)
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0] == JOBS
    assert db.execute("SELECT count(*) FROM skiplock.job_sequences").fetchone()[0] == 0
    # the test tested something: failed attempts were retried, kills cut attempts short
    starts, started_jobs = db.execute("SELECT count(*), count(DISTINCT job_id) FROM seq_starts").fetchone()
    assert started_jobs == JOBS and starts > JOBS + JOBS // 20, starts
    # strictly in order, one at a time: every start (any attempt) of job n+1 after job n's success
    early = db.execute("""
        SELECT s.seq, s.n, s.attempt, s.started, d.ended FROM seq_starts s
          JOIN seq_done d ON d.seq = s.seq AND d.n = s.n - 1
         WHERE s.started <= d.ended LIMIT 5""").fetchall()
    assert early == []
    # and each sequence's successes ended in enqueue order
    out_of_order = db.execute("""
        SELECT seq FROM (SELECT seq, array_agg(n ORDER BY ended) AS ns FROM seq_done GROUP BY seq) x
         WHERE ns <> ARRAY(SELECT generate_series(0, %s - 1))""", [PER_SEQUENCE]).fetchall()
    assert out_of_order == []
    # a job's attempts never overlapped either: its successful end is after every start of it
    assert db.execute("SELECT count(*) FROM seq_starts s JOIN seq_done d USING (job_id) "
                      "WHERE s.started > d.ended").fetchone()[0] == 0
