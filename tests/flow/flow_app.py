"""The tasks the flow-control tests run in real worker processes (tests/flow/). Each handler
records its run through ``job.conn`` -- (job, partition, start, end, pid), both times from the
database's clock -- so a run is recorded exactly when its job's completion commits, and the
interval [start, end] lies inside the time its lease held its slots."""

from __future__ import annotations

import os
import random
import threading
import time

import psycopg

import skiplock

LEASE = os.environ.get("FLOW_LEASE", "transaction")
SECONDS = float(os.environ.get("FLOW_SECONDS", "0.02"))
FAIL_RATE = float(os.environ.get("FLOW_FAIL_RATE", "0.1"))

app = skiplock.App()


def _record(job, customer) -> None:
    started = job.conn.execute("SELECT clock_timestamp()").fetchone()[0]
    time.sleep(SECONDS)
    job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                     "VALUES (%s, %s, %s, clock_timestamp(), %s)", (job.id, str(customer), started, os.getpid()))


@app.task("limited", queue="flow", concurrency=2, partition_by="customer", lease=LEASE, lease_seconds=2)
def limited(job, customer):
    _record(job, customer)


@app.task("rated", queue="rated", rate=os.environ.get("FLOW_RATE", "20/s"), lease=LEASE, lease_seconds=2)
def rated(job, n):
    _record(job, n)


@app.task("plain", queue="flow")
def plain(job, n):
    _record(job, n)


# ---- sequences (test_sequences_processes.py) ------------------------------------------------------

_starts = threading.local()


def _start_conn():
    """This thread's autocommit connection for recording attempt starts (they must survive the
    attempt's rollback: a failed or killed attempt still started)."""
    conn = getattr(_starts, "conn", None)
    if conn is None or conn.closed:
        conn = _starts.conn = psycopg.connect(os.environ["FLOW_DSN"], autocommit=True)
    return conn


@app.task("seq_step", queue="seq", sequence_by="seq", lease=LEASE, lease_seconds=2, max_attempts=1000, retry=0)
def seq_step(job, seq, n):
    _start_conn().execute("INSERT INTO seq_starts (job_id, seq, n, attempt, started, pid) "
                          "VALUES (%s, %s, %s, %s, clock_timestamp(), %s)", (job.id, seq, n, job.attempt, os.getpid()))
    time.sleep(random.random() * SECONDS)
    if random.random() < FAIL_RATE:
        raise RuntimeError(f"random failure of {seq}/{n}")
    job.conn.execute("INSERT INTO seq_done (job_id, seq, n, ended, pid) VALUES (%s, %s, %s, clock_timestamp(), %s)",
                     (job.id, seq, n, os.getpid()))
