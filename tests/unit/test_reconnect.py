"""skiplock.reconnect without a database: the backoff policy, the readiness probe's wake-ups (with a
scripted "server"), one log line per outage, the driver-noise filter, and the connect_timeout option."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import skiplock
from skiplock.errors import ConfigurationError, DatabaseUnavailable
from skiplock.reconnect import AFTERMATH, Backoff, DriverNoise, ReadinessProbe, Reconnects


# ---- Backoff ---------------------------------------------------------------------------------------


def test_backoff_is_full_jitter_within_a_doubling_ceiling():
    seen: list[tuple[float, float]] = []

    def rng(low: float, high: float) -> float:
        seen.append((low, high))
        return high  # the largest delay allowed each time

    b = Backoff(0.25, 16.0, rng=rng)
    delays = [b.next() for _ in range(10)]
    assert delays == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 16.0, 16.0]
    assert all(low == 0.0 for low, _ in seen)  # full jitter: anywhere from 0
    assert b.failures == 10


def test_backoff_delays_are_random_below_the_ceiling_and_never_above_the_cap():
    b = Backoff(0.25, 2.0, rng=random.Random(7).uniform)
    delays = []
    for _ in range(200):
        ceiling = b.ceiling()
        d = b.next()
        assert 0.0 <= d <= ceiling <= 2.0
        delays.append(d)
    assert len(set(delays)) == len(delays)  # jittered: no two loops retry in lockstep
    assert min(delays[10:]) < 1.0 < max(delays[10:])  # spread over the whole range, not clustered at the cap


def test_backoff_resets_after_a_success():
    b = Backoff(0.25, 30.0, rng=lambda low, high: high)
    for _ in range(8):
        b.next()
    assert b.ceiling() == 30.0
    b.reset()
    assert b.failures == 0 and b.next() == 0.25


def test_backoff_refuses_nonsense():
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(1.0, -0.5)
    small = Backoff(0.25, 0.05, rng=lambda low, high: high)  # a cap below the base is the cap
    assert [small.next() for _ in range(3)] == [0.05, 0.05, 0.05]


def test_backoff_survives_a_very_long_outage():
    b = Backoff(0.25, 30.0, rng=lambda low, high: high)
    for _ in range(10_000):
        b.next()
    assert b.next() == 30.0


# ---- the readiness probe ------------------------------------------------------------------------------


class ScriptedServer:
    """What the probe sees: down until ``up`` is set; counts the probe's attempts."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.attempts = 0
        self.reject_other = False  # answers, but refuses us (a wrong password): not an outage

    def __call__(self, dsn: str) -> bool | None:
        self.attempts += 1
        if self.reject_other:
            return None
        return self.up.is_set()


def test_the_probe_wakes_every_waiter_when_the_server_is_back_whatever_their_backoff():
    server = ScriptedServer()
    probe = ReadinessProbe("dsn", answers=server, pause=(0.01, 0.02))
    results: list[bool] = []
    failed_at = time.monotonic()
    threads = [threading.Thread(target=lambda: results.append(probe.wait(failed_at, 600.0))) for _ in range(8)]
    for t in threads:
        t.start()
    while server.attempts < 5:  # the server stays down for a few probe attempts
        time.sleep(0.005)
    server.up.set()
    for t in threads:
        t.join(30)  # safety net: a waiter still asleep here would have slept 600 s
    assert results == [True] * 8
    assert not any(t.is_alive() for t in threads)
    assert probe._thread is None  # it stops once the server answers


def test_one_probe_for_all_waiters_at_a_bounded_rate():
    server = ScriptedServer()
    probe = ReadinessProbe("dsn", answers=server, pause=(0.05, 0.05))
    failed_at = time.monotonic()
    threads = [threading.Thread(target=probe.wait, args=(failed_at, 0.5)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # one attempt per pause, for all 16 waiters together (not one per waiter): about 0.5 / 0.05
    assert 1 <= server.attempts <= 15


def test_a_return_the_waiter_missed_while_failing_still_counts():
    server = ScriptedServer()
    probe = ReadinessProbe("dsn", answers=server, pause=(0.01, 0.01))
    probe.wait(time.monotonic(), 0.05)  # the probe sees the server down
    failed_at = time.monotonic()
    server.up.set()
    while probe._thread is not None:  # it sees the server back before this caller waits
        time.sleep(0.005)
    assert probe.wait(failed_at, 600.0) is True  # returns at once, not after 600 s


def test_a_failure_the_probe_cannot_confirm_wakes_nobody_early():
    server = ScriptedServer()
    server.up.set()  # the server answers: the caller failed for another reason
    probe = ReadinessProbe("dsn", answers=server, pause=(0.01, 0.01))
    start = time.monotonic()
    assert probe.wait(time.monotonic(), 0.3) is False
    assert time.monotonic() - start >= 0.3  # it waited its own backoff: no retry storm
    server.up.clear()
    server.reject_other = True
    assert probe.wait(time.monotonic(), 0.2) is False


def test_a_stopping_event_ends_the_wait():
    server = ScriptedServer()
    probe = ReadinessProbe("dsn", answers=server, pause=(0.01, 0.01))
    stopping = threading.Event()
    threading.Timer(0.1, stopping.set).start()
    assert probe.wait(time.monotonic(), 600.0, stopping) is False


# ---- one log line per outage ----------------------------------------------------------------------------


def test_an_outage_noticed_by_many_loops_is_one_warning_and_one_info(caplog):
    log = logging.getLogger("skiplock.test-reconnect")
    r = Reconnects(None, log)
    backoffs = {f"slot {i}": r.backoff() for i in range(4)}
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for _ in range(3):
            for who, b in backoffs.items():
                r.lost(who, DatabaseUnavailable("cannot connect to PostgreSQL: refused"), 0.0, None)
                b.next()
        for who, b in backoffs.items():
            r.connected(who, b)
    records = [(rec.levelname, rec.getMessage()) for rec in caplog.records if rec.name == log.name]
    warnings = [m for level, m in records if level == "WARNING"]
    infos = [m for level, m in records if level == "INFO"]
    assert warnings == ["slot 0: database connection lost (cannot connect to PostgreSQL: refused); reconnecting"]
    assert len(infos) == 1 and infos[0].startswith("slot 0: reconnected to the database after ")
    assert all(b.failures == 0 for b in backoffs.values())
    assert not r.down


def test_a_loop_that_notices_late_continues_the_episode_but_a_new_outage_is_reported(caplog, monkeypatch):
    log = logging.getLogger("skiplock.test-reconnect-late")
    r = Reconnects(None, log)
    clock = [1000.0]
    monkeypatch.setattr("skiplock.reconnect.time.monotonic", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger=log.name):
        r.lost("slot 0", DatabaseUnavailable("down"), 0.0, None)
        clock[0] += 6
        r.connected("slot 0")
        clock[0] += 0.2
        r.lost("slot 3", DatabaseUnavailable("dead idle connection"), 0.0, None)  # the same outage
        r.connected("slot 3")
        clock[0] += AFTERMATH + 1
        r.lost("slot 1", DatabaseUnavailable("down again"), 0.0, None)  # a new one
        clock[0] += 0.1
        r.lost("slot 2", DatabaseUnavailable("still down"), 0.0, None)
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == log.name and rec.levelname == "WARNING"]
    assert [w.split(":")[0] for w in warnings] == ["slot 0", "slot 1"]


def test_a_quiet_continuation_that_turns_into_an_outage_is_reported(caplog, monkeypatch):
    log = logging.getLogger("skiplock.test-reconnect-flap")
    r = Reconnects(None, log)
    clock = [1000.0]
    monkeypatch.setattr("skiplock.reconnect.time.monotonic", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger=log.name):
        r.lost("slot 0", DatabaseUnavailable("down"), 0.0, None)
        r.connected("slot 0")
        clock[0] += 1
        r.lost("slot 0", DatabaseUnavailable("down again"), 0.0, None)  # within the aftermath: quiet
        clock[0] += AFTERMATH + 1
        r.lost("slot 0", DatabaseUnavailable("still down"), 0.0, None)  # but it lasts: reported
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == log.name and rec.levelname == "WARNING"]
    assert len(warnings) == 2 and "still down" in warnings[1]


# ---- the driver's noise ---------------------------------------------------------------------------------


def _record(msg: str, thread: str, level: int = logging.WARNING, name: str = "psycopg") -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, msg, ("x", "y"), None)
    rec.threadName = thread
    return rec


def test_driver_noise_about_skiplocks_connections_is_dropped_and_nothing_else():
    f = DriverNoise()
    assert not f.filter(_record("error ignored exiting %r: %s", "skiplock-slot-0"))  # Pipeline [BAD]
    assert not f.filter(_record("error connecting in %r: %s", "skiplock-worker-1", name="psycopg.pool"))
    assert f.filter(_record("error ignored exiting %r: %s", "MainThread"))  # the application's own connection
    assert f.filter(_record("unknown PostgreSQL timezone: %r; will use UTC", "skiplock-slot-0"))
    assert f.filter(_record("error ignored exiting %r: %s", "skiplock-slot-0", level=logging.ERROR))


# ---- App(connect_timeout=...) -------------------------------------------------------------------------


def test_connect_timeout_option_and_environment(monkeypatch):
    monkeypatch.delenv("SKIPLOCK_CONNECT_TIMEOUT", raising=False)
    assert skiplock.App("host=/nowhere").connect_timeout == 5.0
    assert skiplock.App("host=/nowhere", connect_timeout=1).connect_timeout == 1.0
    monkeypatch.setenv("SKIPLOCK_CONNECT_TIMEOUT", "2.5")
    assert skiplock.App("host=/nowhere").connect_timeout == 2.5
    assert skiplock.App("host=/nowhere", connect_timeout=0.5).connect_timeout == 0.5  # the argument wins
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("SKIPLOCK_CONNECT_TIMEOUT", bad)
        with pytest.raises(ConfigurationError, match="SKIPLOCK_CONNECT_TIMEOUT"):
            skiplock.App("host=/nowhere")
    monkeypatch.delenv("SKIPLOCK_CONNECT_TIMEOUT")
    for bad_value in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ConfigurationError, match="connect_timeout"):
            skiplock.App("host=/nowhere", connect_timeout=bad_value)


def test_the_cli_refuses_a_bad_connect_timeout_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["SKIPLOCK_CONNECT_TIMEOUT"] = "soon"
    proc = subprocess.run([sys.executable, "-m", "skiplock", "--dsn", "host=/nonexistent port=1", "status"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "error: SKIPLOCK_CONNECT_TIMEOUT must be a number of seconds, got 'soon'"], proc.stderr
