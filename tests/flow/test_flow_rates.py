"""Rate limits across real worker processes (docs/flow-control.md): 40 jobs of a task with
``rate="20/s"`` (the issue's 600 at 100/min, scaled down) drained by 3 processes x 2 slots start at
that rate -- evenly spaced, never bunched -- and a job held back by the rate uses no attempt.

Stated tolerance: the starts are recorded by the handlers (the database's clock), a few ms after the
start was granted (``take_starts``), so any k consecutive starts span at least (k-1)/rate less
JITTER; and the run as a whole goes at no less than a third of the rate (a loose floor for a busy
2-core machine: the guarantee is the ceiling)."""

from __future__ import annotations

from typing import Any

import psycopg
from support import wait_for

import skiplock

JOBS, RATE = 40, 20.0
JITTER = 0.1  # seconds


def test_rate_limit_spaces_starts_across_processes(dsn: str, runs: psycopg.Connection[Any], spawn: Any) -> None:
    with skiplock.App(dsn) as producer:
        producer.enqueue_many([("rated", {"n": i}, {"queue": "rated"}) for i in range(JOBS)])
    for _ in range(3):
        spawn.worker(dsn, concurrency=2, env={"FLOW_RATE": f"{RATE:g}/s", "FLOW_SECONDS": "0"})
    wait_for(lambda: runs.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0] == JOBS,
             timeout=60, what="every job done", on_timeout=lambda: spawn.procs[0].output()[-3000:])
    starts = [r[0] for r in runs.execute("SELECT extract(epoch FROM started)::float8 FROM flow_runs ORDER BY started")]
    assert len(starts) == JOBS
    every = 1 / RATE
    for k in range(1, JOBS):  # never faster than the rate, over any span
        tightest = min(starts[i + k] - starts[i] for i in range(JOBS - k))
        assert tightest >= k * every - JITTER, (k, tightest)
    assert (JOBS - 1) / (starts[-1] - starts[0]) >= RATE / 3
    attempts = runs.execute("SELECT array_agg(DISTINCT attempts) FROM skiplock.jobs").fetchone()[0]
    assert attempts == [1]  # held back by the rate: no attempt used
