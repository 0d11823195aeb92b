"""The tasks the flow-control tests run in real worker processes (tests/flow/). Each handler
records its run through ``job.conn`` -- (job, partition, start, end, pid), both times from the
database's clock -- so a run is recorded exactly when its job's completion commits, and the
interval [start, end] lies inside the time its lease held its slots."""

from __future__ import annotations

import os
import time

import skiplock

LEASE = os.environ.get("FLOW_LEASE", "transaction")
SECONDS = float(os.environ.get("FLOW_SECONDS", "0.02"))

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
