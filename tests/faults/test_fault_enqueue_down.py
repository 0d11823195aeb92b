"""Enqueue while the server is down: a clear error, nothing half-written.

Invariants: ``App.enqueue``/``enqueue_many`` raise :class:`DatabaseUnavailable` naming the server; the
CLI's ``enqueue`` prints one ``error:`` line and exits 3, without a traceback; once the server is back
the jobs table is exactly as before. A batch insert cut by an immediate shutdown mid-statement leaves
all of its jobs or none.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

import faults_tasks
from faults_support import SUMMARY, Figures, run_cli, scalar, wait_for
from skiplock import errors as skiplock_errors
from skiplock.errors import DatabaseUnavailable


def snapshot(dsn: str) -> tuple[int, int | None, list]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT count(*), max(id), array_agg(id ORDER BY id) FROM skiplock.jobs").fetchone()


def test_enqueue_while_the_server_is_down(fault_server, fdsn, producer):
    producer.enqueue_many([("txn_effect", {})] * 5)
    producer.close()
    before = snapshot(fdsn)
    fault_server.stop("fast")
    try:
        app = faults_tasks.build_app(fdsn)  # a process that has not connected yet (a fresh producer)
        with pytest.raises(DatabaseUnavailable) as one:
            app.enqueue("txn_effect", {"x": 1})
        with pytest.raises(DatabaseUnavailable) as many:
            app.enqueue_many([("claimed_effect", {"x": i}) for i in range(100)])
        for exc in (one.value, many.value):
            message = str(exc)
            assert message.startswith("cannot connect to PostgreSQL"), message
            assert str(fault_server.port) in message and str(fault_server.socket_dir) in message, message
        cli = run_cli(fdsn, "enqueue", "txn_effect", "--args", '{"x": 1}')
        cli_app = run_cli(fdsn, "enqueue", "claimed_effect", "--app", "faults_tasks:app")
    finally:
        fault_server.start()
    after = snapshot(fdsn)
    SUMMARY.append(Figures("enqueue while the server is down", "both", 103, "server stopped", after[0] - before[0],
                           0, 0, 0, 0.0, note="2 API calls (1 + 100 jobs) and 2 CLI calls refused; "
                           f"{after[0] - before[0]} row(s) changed"))
    for proc in (cli, cli_app):
        assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.startswith("error: cannot connect to PostgreSQL"), proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    assert after == before  # nothing half-written


def test_batch_enqueue_cut_by_an_immediate_shutdown_is_all_or_nothing(fault_server, fdsn, producer, fdb):
    n = 30000
    before = snapshot(fdsn)
    outcome: dict[str, object] = {}

    def enqueue() -> None:
        try:
            outcome["ids"] = producer.enqueue_many([("txn_effect", {"n": i, "pad": "x" * 100}) for i in range(n)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    thread = threading.Thread(target=enqueue)
    thread.start()
    try:
        # a batch this large is streamed with COPY (smaller ones: INSERT … unnest)
        wait_for(lambda: scalar(fdb, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                     "AND (query LIKE 'COPY %%jobs%%' OR query LIKE '%%INSERT INTO%%jobs%%') "
                                     "AND pid <> pg_backend_pid()")
                 or "ids" in outcome or "error" in outcome, 30, "the batch insert to be running")
        cut = "ids" not in outcome and "error" not in outcome
        fault_server.stop("immediate")
        thread.join(60)
    finally:
        fault_server.start()
    assert not thread.is_alive()
    after = snapshot(fdsn)
    new = after[0] - before[0]
    SUMMARY.append(Figures("batch enqueue cut by immediate shutdown", "transaction", n, "1 immediate shutdown",
                           0 if new in (0, n) else n - new, 0, 0, 0, 0.0,
                           note=f"{'cut mid-COPY' if cut else 'committed before the shutdown'}: {new} of {n} "
                                "rows written (all or nothing)"))
    if "ids" in outcome:  # committed just before the shutdown: all of it
        assert new == n, (new, outcome)
    else:  # cut: none of it
        assert new == 0, (new, outcome)
        assert isinstance(outcome["error"], (psycopg.Error, skiplock_errors.SkiplockError)), outcome


def test_enqueue_on_an_app_that_connected_before_the_server_went_down(fault_server, fdsn, producer):
    producer.enqueue("txn_effect")  # the App's pool now holds a connection
    before = snapshot(fdsn)
    fault_server.stop("fast")
    try:
        with pytest.raises(DatabaseUnavailable):
            producer.enqueue("txn_effect")
    finally:
        fault_server.start()
    assert snapshot(fdsn) == before


def test_enqueue_after_a_server_restart_on_an_app_that_connected_before(fault_server, fdsn, producer):
    producer.enqueue("txn_effect")
    fault_server.restart("fast")
    job_id = producer.enqueue("txn_effect")  # the server is up: this should just work
    assert producer.get_job(job_id).state == "queued"
