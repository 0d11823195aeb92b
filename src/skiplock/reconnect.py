"""Reconnecting after the database went away: one backoff policy, one readiness probe, one log line.

Every loop that holds a connection (worker slots, the LISTEN connection, the outbox relay, the
maintenance services) reconnects the same way, through :class:`Reconnects`:

- :class:`Backoff` -- "full jitter": the n-th consecutive failure waits ``uniform(0, min(cap, base *
  2**n))`` seconds, so loops that failed together do not retry together; reset after a success.
- :class:`ReadinessProbe` -- one per process and server: while anyone waits to reconnect, it tries
  one short connection every 0.25-0.75 s (random). When the server answers again after it was seen
  down, every waiter is woken at once. So a loop resumes within about a second of the server's
  return, however long the outage was and however long its own backoff had grown, and an outage
  costs the server one refused connection attempt per process every half second or so, not one per
  slot.
- One WARNING when a component loses the database ("... database connection lost (reason);
  reconnecting"), one INFO when it is back ("... reconnected to the database after 17.2s"), per
  episode and per :class:`Reconnects` (a worker, a relay), however many of its slots noticed; the
  other reports of the episode are DEBUG. :func:`quiet_driver_noise` drops the driver's own warnings
  about the same connections ("error ignored exiting <psycopg.Pipeline [BAD]>", the pool's "error
  connecting in 'skiplock'"), which say nothing more.

Nothing here is a guarantee about jobs (the transaction is the lease whatever happens to the
connection); it is about how soon work resumes and how much the log says.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .backend.probes import answers as _answers  # one attempt, by the DSN's backend

log = logging.getLogger("skiplock.reconnect")

# The first retry waits up to BASE seconds; each failure doubles the ceiling, up to the cap.
BASE = 0.25
# The probe's pause between attempts while the server is down: uniform in this range (seconds).
PROBE_PAUSE = (0.25, 0.75)
# A loss reported this soon after the previous episode ended continues it (a slot that finds its
# dead connection only after another slot has reconnected): no second WARNING for one outage.
AFTERMATH = 5.0


def reason(exc: BaseException) -> str:
    """The first line of an error, for a log line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Backoff:
    """Full-jitter exponential backoff (pure: no I/O, the random source injectable).

    ``next()`` after the n-th consecutive failure (n = 0, 1, ...) returns ``uniform(0, min(cap, base *
    2**n))``; ``reset()`` after a success starts again from ``base``. ``failures`` counts the
    failures since the last reset."""

    def __init__(self, base: float = BASE, cap: float = 30.0, rng: Callable[[float, float], float] = random.uniform):
        if not base > 0 or not cap >= 0:
            raise ValueError(f"backoff needs base > 0 and cap >= 0, got base={base!r} cap={cap!r}")
        self.base = float(base)
        self.cap = float(cap)
        self.failures = 0
        self._rng = rng

    def ceiling(self) -> float:
        """The most the next delay can be."""
        return min(self.cap, self.base * 2.0 ** min(self.failures, 64))

    def next(self) -> float:
        delay = self._rng(0.0, self.ceiling())
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class ReadinessProbe:
    """Wakes every waiter when the server is back (see the module docstring). One per process and
    DSN (:func:`probe_for`); its thread runs only while someone waits and the server is not seen up.

    ``wait(failed_at, timeout, stopping)`` returns True as soon as the probe has seen the server
    answer after having seen it down, at a time after ``failed_at`` (when the caller's own attempt
    failed; so a return the caller missed while it was busy failing still counts), False after
    ``timeout`` or once ``stopping`` is set. A failure the probe cannot confirm (the server answers:
    the caller failed for another reason) wakes nobody early: the caller waits its own backoff."""

    def __init__(self, dsn: str, answers: Callable[[str], bool | None] = _answers,
                 pause: tuple[float, float] = PROBE_PAUSE):
        self._dsn = dsn
        self._answers = answers
        self._pause = pause
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._waiters = 0
        self._seen_down = False
        self.back_at = float("-inf")  # monotonic time the server was last seen back after being down
        self.attempts = 0

    def wait(self, failed_at: float, timeout: float, stopping: threading.Event | None = None) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiters += 1
            try:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="skiplock-probe", daemon=True)
                    self._thread.start()
                while self.back_at <= failed_at:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or (stopping is not None and stopping.is_set()):
                        return False
                    self._cond.wait(min(remaining, 0.1))  # short: ``stopping`` is an Event of its own
                return True
            finally:
                self._waiters -= 1

    def _run(self) -> None:
        # Every exit clears ``_thread`` under the lock in which it decided to exit, so a waiter that
        # comes in meanwhile either sees this thread still going or starts a new one.
        try:
            while True:
                answered = self._answers(self._dsn)
                with self._cond:
                    self.attempts += 1
                    if answered is not False:
                        if answered and self._seen_down:
                            self.back_at = time.monotonic()
                            self._cond.notify_all()
                            log.debug("the server accepts connections again; waking %d waiter(s)", self._waiters)
                        self._seen_down = False
                        self._thread = None
                        return
                    self._seen_down = True
                    if self._waiters == 0:  # nobody waits; the next waiter starts a new probe
                        self._thread = None
                        return
                time.sleep(random.uniform(*self._pause))
        except BaseException:
            with self._cond:
                self._thread = None
            raise


_probes: dict[str, ReadinessProbe] = {}
_probes_lock = threading.Lock()


def probe_for(dsn: str) -> ReadinessProbe:
    """The process's probe for this server."""
    with _probes_lock:
        probe = _probes.get(dsn)
        if probe is None:
            probe = _probes[dsn] = ReadinessProbe(dsn)
        return probe


class Reconnects:
    """How one component (a worker with its slots, listener and services; a relay) waits to reconnect
    and what it logs. Its loops each keep a :meth:`backoff`; on a lost connection they call
    :meth:`lost` (logs, then waits the next backoff delay or until the probe sees the server back),
    and after their next success :meth:`connected` (logs the end of the episode, resets the backoff).
    ``dsn`` None: no probe (the backoff alone)."""

    def __init__(self, dsn: str | None, logger: logging.Logger, *, cap: float = 30.0, base: float = BASE):
        self.probe = probe_for(dsn) if dsn else None
        self.log = logger
        self.cap = max(0.0, float(cap))  # the caller's, even below BASE (tests use tiny ones)
        self.base = base
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._ended_at = float("-inf")
        self._warned = False

    def backoff(self) -> Backoff:
        return Backoff(self.base, self.cap)

    def lost(self, who: str, exc: BaseException, delay: float, stopping: threading.Event | None) -> None:
        """``who`` lost (or could not make) its connection: report it (one WARNING per episode) and
        wait ``delay`` seconds, or less if the server is seen back meanwhile, or until ``stopping``."""
        failed_at = time.monotonic()
        self._report(who, exc, failed_at)
        if self.probe is not None:
            self.probe.wait(failed_at, delay, stopping)
        elif stopping is not None:
            stopping.wait(delay)
        else:
            time.sleep(delay)

    def connected(self, who: str, backoff: Backoff | None = None) -> None:
        """``who`` works again. Cheap when nothing was wrong (callers may call it after every success)."""
        if backoff is not None:
            if not backoff.failures:
                return
            backoff.reset()
        with self._lock:
            if self._down_since is None:
                return
            took = time.monotonic() - self._down_since
            self._down_since = None
            self._ended_at = time.monotonic()
            warned = self._warned
        (self.log.info if warned else self.log.debug)("%s: reconnected to the database after %.1fs", who, took)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def _report(self, who: str, exc: BaseException, now: float) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = now
                # A loss right after the last episode ended belongs to it (no second WARNING)...
                self._warned = now - self._ended_at > AFTERMATH
                warn = self._warned
            elif not self._warned and now - self._down_since > AFTERMATH:
                self._warned = warn = True  # ...unless it turns into an outage of its own
            else:
                warn = False
        if warn:
            self.log.warning("%s: database connection lost (%s); reconnecting", who, reason(exc))
        else:
            self.log.debug("%s: still reconnecting (%s)", who, reason(exc))


# ---- the driver's own log lines about the same connections ----------------------------------------

# Messages psycopg and psycopg_pool log about a connection that died, which skiplock reports itself.
DRIVER_NOISE = (
    "error ignored exiting",       # <psycopg.Pipeline [BAD]>: a pipeline whose connection died
    "error ignored terminating",   # the same for a COPY or pipeline being torn down
    "error ignored in rollback",
    "error connecting in",         # psycopg_pool, while the server is down
    "reconnection attempt in pool",
    "discarding broken connection",
    "discarding closed connection",
)


_reporting = threading.local()


@contextmanager
def reporting_losses() -> Iterator[None]:
    """On this thread, for the block: skiplock reports a lost connection itself (a worker's start-up,
    on the main thread), so the driver's lines about it are dropped as on skiplock's own threads."""
    _reporting.depth = getattr(_reporting, "depth", 0) + 1
    try:
        yield
    finally:
        _reporting.depth -= 1


class DriverNoise(logging.Filter):
    """Drops DRIVER_NOISE records (WARNING and below) logged on skiplock's own threads (slots,
    listener, services, probe, the pool named ``skiplock``), or inside :func:`reporting_losses`:
    connections skiplock owns and reports on. The same messages about the application's own
    connections, on its threads, are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            return True
        if not (record.threadName or "").startswith("skiplock-") and not getattr(_reporting, "depth", 0):
            return True
        message = record.msg if isinstance(record.msg, str) else str(record.msg)
        return not message.startswith(DRIVER_NOISE)


_noise_filter = DriverNoise()


def quiet_driver_noise() -> None:
    """Install :class:`DriverNoise` on the ``psycopg`` and ``psycopg.pool`` loggers (idempotent)."""
    for name in ("psycopg", "psycopg.pool"):
        logger = logging.getLogger(name)
        if _noise_filter not in logger.filters:
            logger.addFilter(_noise_filter)
