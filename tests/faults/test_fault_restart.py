"""PostgreSQL restarted (fast and immediate shutdown) while four worker processes run.

Transaction-lease and claimed-lease jobs run side by side. Mid-run the server is restarted twice:
once with ``pg_ctl restart`` (down for a moment) and once stopped, left down for two seconds
(workers meet refused connections), then started again. The workers are never restarted by the test:
they must reconnect on their own and finish the run. Invariants, per lease mode: no job lost, no job
finished twice (one committed database-local effect per done job), every job ``done``, and the four
original worker processes still alive and exiting cleanly on SIGTERM. An immediate shutdown is a
crash for PostgreSQL (recovery on start): a COMMIT that was acknowledged survives it, one in flight
may or may not, and a job is either done exactly once or back in the queue.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from faults_support import record, scalar, states_of, unfinished, verdict, wait_for

PER_MODE = 600
DOWN_SECONDS = 2.0


def query(dsn: str, fn: Any) -> Any:
    """Run ``fn(conn)`` on a fresh connection; None while the server is unreachable."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as c:
            return fn(c)
    except psycopg.OperationalError:
        return None


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_while_four_workers_run(mode, fault_server, fdsn, producer, workers, exec_dir):
    ids = producer.enqueue_many([(task, {"sleep": 0.01}) for _ in range(PER_MODE)
                                 for task in ("txn_effect", "claimed_effect")])
    txn_ids, claimed_ids = ids[0::2], ids[1::2]
    producer.close()  # its pooled connections would only die in the restart

    def finished() -> int:
        return query(fdsn, lambda c: len(ids) - unfinished(c, ids)) or 0

    started = time.monotonic()
    procs = [workers.start(fdsn, concurrency=2) for _ in range(4)]
    progress = []
    wait_for(lambda: finished() >= len(ids) // 5, 60, "a fifth of the jobs to finish", on_timeout=procs[0].tail)
    progress.append(finished())
    fault_server.restart(mode)
    wait_for(lambda: finished() >= progress[-1] + len(ids) // 5, 60, "another fifth to finish after the restart",
             on_timeout=lambda: "\n".join(p.tail() for p in procs))
    progress.append(finished())
    fault_server.stop(mode)
    time.sleep(DOWN_SECONDS)  # the fault itself: the server stays down this long
    fault_server.start()

    wait_for(lambda: finished() == len(ids), 90, "every job to finish after the restarts",
             on_timeout=lambda: f"{query(fdsn, lambda c: states_of(c, ids))}\n" + "\n".join(p.tail() for p in procs))
    alive = [p.alive() for p in procs]
    with psycopg.connect(fdsn, autocommit=True) as db:
        codes = workers.stop_all(procs, db)
        elapsed = time.monotonic() - started
        verdicts = {"transaction": verdict(db, txn_ids, exec_dir), "claimed": verdict(db, claimed_ids, exec_dir)}
        rescued = scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) "
                             "AND errors::text LIKE '%%lease expired%%'", [claimed_ids])
    for lease, v in verdicts.items():
        note = f"finished before each restart: {progress}"
        if lease == "claimed":
            note += f"; {rescued} job(s) rescued after their lease expired"
        record(f"PostgreSQL restart ({mode})", lease, v, "2 restarts", elapsed, note=note)

    assert alive == [True] * 4, "a worker died instead of reconnecting\n" + "\n".join(p.tail() for p in procs)
    assert all(code == 0 for code in codes.values()), (codes, [p.tail() for p in procs])
    for lease, v in verdicts.items():
        assert v.problems() == [], (lease, v.problems())
        assert v.states == {"done": PER_MODE}, (lease, v.states)
    assert all("reconnect" in p.output() for p in procs), "\n".join(p.tail() for p in procs)
