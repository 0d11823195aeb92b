"""A worker whose connection is lost while it starts up (a server restart at that moment) keeps
trying, as a running worker does, instead of exiting; one that cannot reach the server at all at
its first try still exits at once with a clear error (a wrong DSN is not waited on).

The loss is made deterministic with the real server: the test holds an EXCLUSIVE lock on the
``workers`` table, so the worker's first write (its presence row, the last start-up step before it
claims) waits on it; the test terminates that waiting session, then lets the lock go. The worker
must report the loss in one WARNING, register, and run a job -- the same process throughout."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from faults_support import scalar, verdict, wait_for


def test_a_connection_lost_during_start_up_is_retried(fdsn, fdb, producer, workers, exec_dir):
    ids = producer.enqueue_many([("txn_effect", {}) for _ in range(20)])
    with psycopg.connect(fdsn) as holder:
        holder.execute("LOCK TABLE skiplock.workers IN EXCLUSIVE MODE")  # reads pass, writes wait
        wp = workers.start(fdsn, concurrency=2)

        def waiting() -> Any:
            return scalar(fdb, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND query LIKE '%%INSERT INTO%%workers%%' LIMIT 1")

        wait_for(lambda: not wp.alive() or waiting() is not None, 60, "the worker's presence write to wait",
                 on_timeout=wp.tail)
        assert wp.alive(), wp.tail()
        assert fdb.execute("SELECT pg_terminate_backend(%s)", [waiting()]).fetchone()[0]
        time.sleep(0.5)  # it has seen the loss and waits to try again (its session is gone meanwhile)
        assert wp.alive(), f"the worker exited on a connection lost at start-up\n{wp.tail()}"
        holder.rollback()  # the lock goes
    wait_for(lambda: scalar(fdb, "SELECT count(*) FROM skiplock.workers WHERE pid = %s", [wp.pid]) == 1, 30,
             "the worker to register", on_timeout=wp.tail)
    wait_for(lambda: scalar(fdb, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                            [ids]) == len(ids), 60, "its jobs", on_timeout=wp.tail)
    assert wp.alive()
    log = wp.output()
    assert log.count("database connection lost") == 1, log  # one WARNING for the episode
    assert "Traceback" not in log and "psycopg" not in log, log  # no driver noise: skiplock reports it
    assert workers.stop_all([wp], fdb) == {wp.pid: 0}
    v = verdict(fdb, ids, exec_dir)
    assert not v.lost and not v.finished_twice and v.states == {"done": len(ids)}, v


def test_a_server_that_cannot_be_reached_at_start_up_is_a_clear_error_at_once(workers, tmp_path):
    unreachable = f"postgresql://nobody@/skiplock?host={tmp_path}&port=1"  # no server: nothing listens there
    started = time.monotonic()
    wp = workers.start(unreachable, concurrency=1)
    code = wp.wait()
    log = wp.output()
    assert code != 0 and time.monotonic() - started < 30, (code, log)
    assert "Traceback" not in log and "error:" in log, log
