"""Recovery after an outage: the server stopped for several seconds, then started again.

Invariants: a worker process (and an outbox relay) left running through the outage resumes on its own and runs the jobs
enqueued once the server is back; its log reports the outage in one WARNING line (and its end in one
INFO line), with none of the driver's own warnings about the same connections ("Pipeline [BAD]",
the pool's "error connecting"). A producer whose pool was open before the outage gets
:class:`DatabaseUnavailable` from ``enqueue``/``enqueue_many``/``outbox.put`` (sync and asyncio)
while the server is down, with a small ``connect_timeout``, and enqueues again as soon as the server
is back -- its pool does not stay stuck in a backoff of its own. Deadlines are safety nets only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import psycopg
import pytest

import faults_tasks
import skiplock
from faults_support import wait_for
from skiplock.errors import DatabaseUnavailable
from skiplock.reconnect import ReadinessProbe

# Longer than several backoff steps (0.25, 0.5, 1, 2, 4 s), so a loop's own backoff has grown well
# past the time it takes the server to come back.
DOWN_SECONDS = 6.0


def states(dsn: str, ids: list[int]) -> dict[str, int] | None:
    """{state: count} of these jobs; None while the server is unreachable."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as c:
            return dict(c.execute("SELECT state, count(*) FROM skiplock.jobs WHERE id = ANY(%s) GROUP BY state",
                                  [ids]).fetchall())
    except psycopg.OperationalError:
        return None


def test_a_worker_resumes_after_an_outage_and_reports_it_once(fault_server, fdsn, producer, workers):
    wp = workers.start(fdsn, concurrency=4, poll_interval=0.5)
    first = producer.enqueue("txn_effect")
    wait_for(lambda: states(fdsn, [first]) == {"done": 1}, 60, "the worker to run a first job", on_timeout=wp.tail)
    producer.close()

    fault_server.stop("fast")
    time.sleep(DOWN_SECONDS)  # the fault itself: the server stays down this long
    fault_server.start()

    after = faults_tasks.build_app(fdsn)
    try:
        ids = after.enqueue_many([("txn_effect", {}) for _ in range(10)])
    finally:
        after.close()
    wait_for(lambda: states(fdsn, ids) == {"done": len(ids)}, 60, "the jobs enqueued after the outage to run",
             on_timeout=lambda: f"{states(fdsn, ids)}\n{wp.tail()}")
    assert wp.alive(), wp.tail()

    lines = wp.output().splitlines()
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == 1, "\n".join(warnings)
    assert "database connection lost" in warnings[0] and "reconnecting" in warnings[0], warnings
    assert [line for line in lines if "reconnected to the database after" in line and " INFO " in line], wp.tail()
    noise = [line for line in lines if "Pipeline" in line or "error connecting" in line or "psycopg" in line]
    assert noise == [], "\n".join(noise)

    with psycopg.connect(fdsn, autocommit=True) as db:
        codes = workers.stop_all([wp], db)
    assert list(codes.values()) == [0], (codes, wp.tail())


def test_enqueue_while_the_server_is_down_fails_within_the_connect_timeout(fault_server, fdsn):
    app = skiplock.App(fdsn, connect_timeout=1.0)
    aapp = skiplock.AsyncApp(app=app)
    try:
        app.enqueue("txn_effect")  # the App's pool is open, as a running producer's is
        fault_server.stop("fast")
        down_at = time.monotonic()
        try:
            for _ in range(2):
                with pytest.raises(DatabaseUnavailable):
                    app.enqueue("txn_effect")
                with pytest.raises(DatabaseUnavailable):
                    app.enqueue_many([("txn_effect", {}) for _ in range(100)])
                with pytest.raises(DatabaseUnavailable):
                    app.outbox.put("topic", {"n": 1})
                with pytest.raises(DatabaseUnavailable):
                    asyncio.run(aapp.enqueue("txn_effect"))
            # Long enough for a pool left to its own reconnect backoff (1 s doubling) to be waiting
            # several seconds for its next attempt when the server is back.
            time.sleep(max(0.0, 9.0 - (time.monotonic() - down_at)))
        finally:
            fault_server.start()
        job_id = app.enqueue("txn_effect")  # at once, within the 1 s connect timeout
        assert app.get_job(job_id).state == "queued"
    finally:
        app.close()


class Collect:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.payloads: list[object] = []
        self._lock = threading.Lock()

    def deliver(self, message: object) -> None:
        with self._lock:
            self.payloads.append(message.payload)  # type: ignore[attr-defined]


def test_a_relay_resumes_after_an_outage_and_reports_it_once(fault_server, fdsn, caplog):
    app = skiplock.App(fdsn, connect_timeout=1.0)
    sink = Collect()
    relay = app.relay(sink, poll_interval=0.5)
    try:
        with caplog.at_level(logging.INFO):
            relay.start()
            app.outbox.put("t", {"n": 0})
            wait_for(lambda: sink.payloads == [{"n": 0}], 60, "the relay to deliver a first message")
            fault_server.stop("fast")
            try:
                time.sleep(DOWN_SECONDS)  # the fault itself
            finally:
                fault_server.start()
            app.outbox.put("t", {"n": 1})  # the same App: its pool did not stay broken
            wait_for(lambda: sink.payloads == [{"n": 0}, {"n": 1}], 60, "the message put after the outage",
                     on_timeout=lambda: str(sink.payloads))
            # The polling pass can deliver before the listener's own reconnect (woken by the readiness
            # probe, up to ~1 s later) has ended the episode: wait for that report before stopping.
            wait_for(lambda: any(r.levelno == logging.INFO and "reconnected to the database after" in r.getMessage()
                                 for r in list(caplog.records)), 30, "the relay to report that it reconnected",
                     on_timeout=lambda: str([r.getMessage() for r in caplog.records]))
    finally:
        relay.stop()
        app.close()
    assert relay.stats.reconnects >= 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "database connection lost" in warnings[0], warnings
    assert [r for r in caplog.records if r.levelno == logging.INFO and "reconnected to the database after" in
            r.getMessage()], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.name.startswith("psycopg")], [r.getMessage() for r in caplog.records]


def test_the_readiness_probe_sees_the_real_server_come_back(fault_server, fdsn):
    """Waiters whose own backoff is 10 minutes are woken when the server accepts connections again."""
    probe = ReadinessProbe(fdsn)
    fault_server.stop("fast")
    woken: list[bool] = []
    try:
        failed_at = time.monotonic()
        waiters = [threading.Thread(target=lambda: woken.append(probe.wait(failed_at, 600.0))) for _ in range(4)]
        for t in waiters:
            t.start()
        wait_for(lambda: probe.attempts >= 3, 30, "the probe to find the server down a few times")
    finally:
        fault_server.start()
    for t in waiters:
        t.join(60)  # safety net; without the probe they would sleep 600 s
    assert woken == [True] * 4
    attempts = probe.attempts
    assert probe.wait(time.monotonic(), 0.5) is False  # the server is up: nothing to wake anyone for
    wait_for(lambda: probe._thread is None, 30, "the probe to stop")
    assert probe.attempts == attempts + 1  # one attempt, then the probe stops


def test_an_asyncio_worker_resumes_after_an_outage_without_a_busy_loop(fault_server, fdsn, caplog):
    """An asyncio worker left running through the outage: its claim loops back off while the server
    is down (a handful of WARNINGs, not thousands), and run the jobs of both lease kinds enqueued once
    it is back."""
    from skiplock.worker.aio_worker import AsyncWorker

    app = skiplock.App(fdsn, connect_timeout=1.0)
    aapp = skiplock.AsyncApp(app=app)
    ran: list[str] = []

    @aapp.task(name="aio_txn")
    async def aio_txn(job, n):
        ran.append(f"txn {n}")

    @aapp.task(name="aio_claimed", lease="claimed")
    async def aio_claimed(job, n):
        ran.append(f"claimed {n}")

    worker = AsyncWorker(app, None, 4, max_connections=4, poll_interval=0.2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(worker.run()), daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="skiplock.worker"):
            app.enqueue_many([("aio_txn", {"n": 0}), ("aio_claimed", {"n": 0})])
            thread.start()
            wait_for(lambda: sorted(ran) == ["claimed 0", "txn 0"], 60, "the worker to run the first jobs",
                     on_timeout=lambda: str(ran))
            fault_server.stop("fast")
            try:
                time.sleep(DOWN_SECONDS)  # the fault itself
            finally:
                fault_server.start()
            ids = wait_for(lambda: _enqueue_or_none(app), 60, "an enqueue after the outage")
            wait_for(lambda: states(fdsn, ids) == {"done": len(ids)}, 60, "the jobs enqueued after the outage",
                     on_timeout=lambda: f"{states(fdsn, ids)} {ran}")
            assert thread.is_alive()
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        app.close()
    assert not thread.is_alive()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # two claim loops (and the pool's waits) over DOWN_SECONDS: each pauses between tries (4 seen)
    assert len(warned) < 100, f"{len(warned)} warnings during a {DOWN_SECONDS:g} s outage: {warned[:3]}"


def _enqueue_or_none(app):
    try:
        return app.enqueue_many([("aio_txn", {"n": i}) for i in range(1, 6)] + [("aio_claimed", {"n": i})
                                                                             for i in range(1, 6)])
    except DatabaseUnavailable:
        return None
