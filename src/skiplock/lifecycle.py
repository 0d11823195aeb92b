"""One lifecycle for every background loop: start/stop, one pass at a time, backoff after a failed
pass, events to wait on, an injectable clock, and the signal handling of the worker and the relay.

:class:`Loop` runs ``step()`` again and again -- in a thread (:meth:`Loop.start`) or in the caller's
(:meth:`Loop.run`) -- until :meth:`Loop.stop`. Its guarantees:

- **A failing pass is never fatal.** An exception of ``retry_on`` (every ``Exception`` unless a loop
  narrows it) is recorded (``failures``, ``last_error``), logged, and the next pass runs after a
  full-jitter backoff (:class:`skiplock.reconnect.Backoff`: the n-th consecutive failure waits
  ``uniform(0, min(cap, 0.25 * 2**n))``; reset by the next pass that succeeds). A lost database
  (:class:`~skiplock.errors.DatabaseUnavailable`, :class:`~skiplock.errors.ConnectionLost`) with a
  ``recovery`` (the owner's :class:`~skiplock.reconnect.Reconnects`) is reported as part of the
  owner's outage -- one WARNING for all of its loops -- and the wait ends early when the process's
  readiness probe sees the server back.
- **Stop is prompt.** :meth:`Loop.stop` ends the pause between passes and any backoff at once; the
  pass in hand finishes. A loop given its owner's ``stopping`` event also stops when the owner sets it.
- **Events instead of sleeps**: ``started``, ``stopped`` (``threading.Event``), ``passes`` and
  ``failures`` (counted under a condition: :meth:`Loop.wait_for_passes`, :meth:`Loop.wait_for_failures`)
  and ``last_error``.
- **Time is injectable**: every wait the loop decides goes through its :class:`Clock`;
  :class:`ManualClock` moves only when a test advances it, so schedules and backoff are tested
  without sleeping.

:class:`Signals` and :func:`escalate` are the signal handling shared by the worker and the relay: the
first SIGTERM/SIGINT stops gracefully, a second one aborts.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

from .errors import DatabaseUnavailable, SkiplockError
from .reconnect import BASE, Backoff, Reconnects, reason

log = logging.getLogger("skiplock.lifecycle")
L = TypeVar("L", bound="Loop")


# ---- time ----------------------------------------------------------------------------------------


@runtime_checkable
class Clock(Protocol):
    """Where a loop reads the time and waits."""

    def monotonic(self) -> float: ...
    def now(self) -> datetime: ...  # the wall clock, timezone-aware UTC
    def wait(self, event: threading.Event, timeout: float) -> bool: ...  # True if ``event`` was set


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when :meth:`advance` is called (for tests). ``wait`` blocks until the
    clock has been advanced to its deadline or the event is set; ``waits`` records every timeout a
    loop asked for, in order, and :meth:`wait_for_waits` blocks until a loop has begun its n-th wait."""

    def __init__(self, start: datetime | None = None):
        self._cond = threading.Condition()
        self._elapsed = 0.0
        self._start = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.waits: list[float] = []

    def monotonic(self) -> float:
        with self._cond:
            return self._elapsed

    def now(self) -> datetime:
        with self._cond:
            return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._elapsed += seconds
            self._cond.notify_all()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self._cond:
            deadline = self._elapsed + max(0.0, timeout)
            self.waits.append(timeout)
            self._cond.notify_all()
            while not event.is_set() and self._elapsed < deadline:
                self._cond.wait(0.01)  # the event is set from another thread: look again soon
            return event.is_set()

    def wait_for_waits(self, n: int, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.waits) >= n, timeout)


# ---- the loop ------------------------------------------------------------------------------------


class Loop:
    """A background loop (see the module docstring). Subclasses define ``step()`` (one pass) and may
    override ``next_delay()`` (seconds from the end of a pass to the next: ``interval`` by default),
    ``on_start()`` / ``on_stop()`` (around the passes, in the loop's thread) and ``on_failure(exc)``
    (after a failed pass, before the backoff: close what the failure broke).

    ``max_backoff`` caps the backoff (default: the recovery's cap, else 30 s); ``rng`` is its random
    source (``uniform(a, b)``); ``stopping`` is the owner's event, when the loop stops with its owner
    (then ``start()`` never clears it)."""

    name = "loop"
    logger = log
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __init__(self, interval: float, *, clock: Clock = SYSTEM_CLOCK, max_backoff: float | None = None,
                 rng: Callable[[float, float], float] = random.uniform, stopping: threading.Event | None = None):
        self.interval = interval
        self.clock = clock
        self.recovery: Reconnects | None = None
        self.passes = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.started = threading.Event()
        self.stopped = threading.Event()
        self._owns_stop = stopping is None
        self._stop = threading.Event() if stopping is None else stopping
        self._wake = threading.Event()  # ends the pause between passes: poke(), stop()
        self._counted = threading.Condition()
        self._thread: threading.Thread | None = None
        self._max_backoff = max_backoff
        self._rng = rng
        self._backoff: Backoff | None = None

    # ---- what a loop does (overridden) -------------------------------------------------------

    def step(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def next_delay(self) -> float:
        return self.interval

    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def on_failure(self, exc: BaseException) -> None:
        pass

    @property
    def who(self) -> str:
        """How the loop is named in log lines."""
        return self.name

    # ---- control -----------------------------------------------------------------------------

    def start(self: L, **run_kwargs: Any) -> L:
        """Run in a daemon thread (``run(**run_kwargs)``); returns at once."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{self.who} is already running")
        if self._owns_stop:
            self._stop.clear()
        self.started.clear()
        self.stopped.clear()
        self._thread = threading.Thread(target=self.run, kwargs=run_kwargs, name=f"skiplock-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """No more passes; the one in hand finishes. Waits up to ``timeout`` for a started thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def poke(self) -> None:
        """Run the next pass now instead of after the pause (not during a backoff)."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_for_passes(self, n: int, timeout: float = 10.0) -> bool:
        """Block until ``n`` passes (successful or failed) have completed."""
        with self._counted:
            return self._counted.wait_for(lambda: self.passes >= n, timeout)

    def wait_for_failures(self, n: int, timeout: float = 10.0) -> bool:
        """Block until ``n`` passes have failed."""
        with self._counted:
            return self._counted.wait_for(lambda: self.failures >= n, timeout)

    # ---- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run passes in this thread until stopped. An exception outside ``retry_on`` ends the loop
        and is raised (``last_error``); ``on_stop`` runs in any case."""
        self.started.clear()  # a loop run again reports its new run
        self.stopped.clear()
        recovery = self.recovery
        cap = self._max_backoff if self._max_backoff is not None else (recovery.cap if recovery else 30.0)
        self._backoff = Backoff(recovery.base if recovery else BASE, max(0.0, cap), self._rng)
        try:
            self.on_start()
            self.started.set()
            while not self._stop.is_set():
                self._wake.clear()  # a poke from here on ends the pause after this pass
                try:
                    self.step()
                except self.retry_on as exc:
                    self._tally(exc)
                    self.on_failure(exc)
                    self._back_off(exc)
                    continue
                self._tally(None)
                self.recovered()
                delay = self.next_delay()
                if delay > 0 and not self._stop.is_set():
                    self.clock.wait(self._wake, delay)
        except BaseException as exc:
            self.last_error = exc
            raise
        finally:
            try:
                self.on_stop()
            finally:
                self.started.set()  # a start() waiting on it never hangs on a loop that failed to start
                self.stopped.set()
                with self._counted:
                    self._counted.notify_all()

    def recovered(self) -> None:
        """The loop works (again): end its backoff and, if it was part of an outage, report the end.
        Called after every pass that succeeds; a step may call it earlier (a reconnect done)."""
        if self._backoff is None or not self._backoff.failures:
            return
        if self.recovery is not None:
            self.recovery.connected(self.who, self._backoff)
        self._backoff.reset()

    def _tally(self, error: BaseException | None) -> None:
        with self._counted:
            self.passes += 1
            if error is not None:
                self.failures += 1
                self.last_error = error
            self._counted.notify_all()

    def _back_off(self, exc: BaseException) -> None:
        assert self._backoff is not None
        if self._stop.is_set():  # failed while stopping (its session closed under it): nothing to report
            return
        delay = self._backoff.next()
        if isinstance(exc, DatabaseUnavailable) and self.recovery is not None:
            self.recovery.lost(self.who, exc, delay, self._stop)  # logs once per outage for the owner
            return
        self.logger.warning("%s: pass failed (%s); retrying in %.2fs", self.who, reason(exc), delay,
                            exc_info=not isinstance(exc, SkiplockError))
        self.clock.wait(self._stop, delay)


# ---- signals -------------------------------------------------------------------------------------


Handler = Callable[[int, Any], Any]


class Signals:
    """SIGINT and SIGTERM handled by ``handler`` from :meth:`install` until :meth:`restore` (or the end
    of a ``with`` block). Only in the main thread (Python delivers signals there); elsewhere, or with
    ``enabled`` False, nothing is installed."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    @classmethod
    def install(cls, handler: Handler, enabled: bool = True) -> "Signals":
        signals = cls()
        if enabled and threading.current_thread() is threading.main_thread():
            for sig in cls.HANDLED:
                signals._previous[sig] = signal.signal(sig, handler)
        return signals

    def restore(self) -> None:
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> "Signals":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


class Escalation:
    """SIGINT/SIGTERM, counted: the first calls ``graceful(name)`` (finish what is in hand, take
    nothing new), any later one ``abort(name)``. Install it as the signals' handler (``Signals.install``).

    The signal is counted before its action runs. A Python signal handler runs between any two
    bytecodes of the main thread, inside another handler too: a second signal sent once the first
    one's action had written its log line arrived while that action was still running, and when the
    count was kept only after the action returned it was taken for a first one -- the abort was lost
    and the worker went on finishing its 120 s job (seen once in CI)."""

    def __init__(self, graceful: Callable[[str], None], abort: Callable[[str], None]):
        self.graceful, self.abort = graceful, abort
        self.received = 0

    def __call__(self, signum: int, frame: Any = None) -> None:  # a signal handler as it is
        self.received += 1
        received = self.received  # this signal's own place, whatever a nested one does to the count
        (self.graceful if received == 1 else self.abort)(signal.Signals(signum).name)
