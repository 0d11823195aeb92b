"""The outbox relay: claims unsent messages with FOR UPDATE SKIP LOCKED, delivers them through a sink,
and writes each outcome fenced on the state it claimed the message in.

Two lease modes (see docs/outbox.md for the trade-off in full):

- **claimed** (default for external sinks such as :class:`HttpSink`). A short transaction claims a
  batch (pending -> delivering, owner token, ``lease_expires_at``) and commits; the messages are
  delivered with no transaction open; one statement then marks them sent / retry / failed
  ``WHERE state = 'delivering' AND owner = token``. While a batch is still being delivered the
  lease is extended every ``lease_seconds / 3``. Any relay's claim transaction first returns
  expired leases to pending (crashed or stalled relays). Why the default: an HTTP call can take
  up to its timeout, and holding a transaction (a connection, row locks and an xid that holds back
  vacuum's horizon for every table) open across network calls to someone else's server is the cost
  the seed warns about; the claim also counts the attempt durably, so a message that crashes its
  relay every time still ends ``failed``. Its price: after a crash the messages wait for their
  lease to expire (``lease_seconds``) before redelivery, and a relay stalled beyond its lease (a
  long GC pause, SIGSTOP, a network partition) can deliver a message another relay also delivers;
  the fence keeps the database state right, the receiver's dedup keeps the effect single.
- **transaction** (the seed's protocol; always used for transactional sinks such as
  :class:`EnqueueJobSink`, optional for external ones). One transaction claims the batch with
  FOR UPDATE SKIP LOCKED, delivers while holding the row locks, writes the outcomes and commits; a
  crash or lost connection rolls everything back and the messages are available again at once.
  For a database-local sink this is exactly once. For an external sink it holds a transaction open
  during the calls, and a crash mid-delivery is not counted as an attempt (it rolled back).

In the normal case (no crash, no stall past the lease) no message is delivered twice, with any
number of relays running: each claim skips the rows other relays hold.

Wake-ups: every ``put`` sends one NOTIFY (channel ``skiplock``, payload ``outbox:<schema>``) when
its transaction commits. A running relay listens (the worker's
:class:`~skiplock.worker.listener.Listener`, one more session) and claims at once when one arrives.
The notification is a hint: the relay still polls every ``poll_interval`` and claims once after every
(re)connect of the listener.

The relay is a :class:`skiplock.lifecycle.Loop` (one batch per pass): losing the database (an outage,
a restart) is waited out like every other loop -- full-jitter backoff up to ``max_reconnect_delay``,
cut short when the process's readiness probe sees the server back, one WARNING per outage -- and the
first SIGINT/SIGTERM finishes the batch in hand, a second one aborts (:mod:`skiplock.lifecycle`).
Driver-free: the store (``backend/outbox_base.py``) raises only skiplock errors.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..backend.outbox_base import Finish, Message, OutboxLease, OutboxStore
from ..errors import ConfigurationError, DatabaseError, DatabaseUnavailable
from ..lifecycle import Escalation, Loop, Signals
from ..reconnect import Reconnects, quiet_driver_noise
from ..retry import RetryPolicy, as_policy
from ..worker.listener import Listener
from .delivery import deliver_external, deliver_in_transaction
from .policy import DEFAULT_RETRY, decide
from .sinks import check_sink, is_transactional

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.relay")
LEASE_MODES = ("claimed", "transaction")
_names = itertools.count()


@dataclass
class RelayStats:
    sent: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0  # outcomes not written: the lease had expired and another relay took the message
    rescued: int = 0  # expired leases (of crashed/stalled relays) this relay returned to the queue
    batches: int = 0
    reconnects: int = 0


def _check_number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise ConfigurationError(f"{name} must be a number in ({low:g}, {high:g}], got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{name} must be an integer between {low} and {high}, got {value!r}")
    return value


class Relay(Loop):
    """Delivers outbox messages through ``sink``. Create it with :meth:`App.relay` (or directly).

    ``run()`` blocks until :meth:`stop` (or SIGINT/SIGTERM in the main thread, or, with
    ``stop_when_empty``, until a claim finds nothing available); ``start()`` runs it in a thread.
    Stopping finishes the batch in hand (deliveries and outcome writes) and exits.

    Options: ``topics`` (only these), ``batch_size`` (messages per claim), ``concurrency``
    (deliveries in flight at once, for sinks without ``deliver_batch``), ``lease`` ("claimed" or
    "transaction"; default: "transaction" for transactional sinks, else "claimed"),
    ``lease_seconds`` (claimed lease length; extended while a batch is in hand), ``poll_interval``
    (wait when nothing is available, unless a put's NOTIFY wakes it first), ``listen`` (wake on
    those notifications; one more connection per running relay), ``retry`` (backoff policy, a
    skiplock.retry policy or a number of seconds; default exponential 1 s .. 10 min with jitter).
    Events (:mod:`skiplock.lifecycle`): ``started``, ``stopped``, ``idle`` (set while the last claim
    found nothing), ``wait_for_passes``, ``last_error``.
    """

    logger = log
    retry_on = (DatabaseError, DatabaseUnavailable)  # a database failure is waited out; a bug ends run()

    def __init__(self, app: "App", sink: Any, *, topics: Sequence[str] | None = None, batch_size: int = 100,
                 concurrency: int = 16, lease: str | None = None, lease_seconds: float = 30.0,
                 poll_interval: float = 0.5, retry: RetryPolicy | float | None = None, name: str | None = None,
                 handle_signals: bool = True, max_reconnect_delay: float = 30.0, listen: bool = True):
        self.app = app
        self.sink = check_sink(sink)
        self.transactional = is_transactional(sink)
        if lease is None:
            lease = "transaction" if self.transactional else "claimed"
        if lease not in LEASE_MODES:
            raise ConfigurationError(f"lease must be one of {', '.join(LEASE_MODES)}, got {lease!r}")
        if self.transactional and lease != "transaction":
            raise ConfigurationError(f"{sink!r} writes in the relay's transaction: it needs lease='transaction'")
        self.lease = lease
        if topics is not None:
            topics = list(topics)
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ConfigurationError(f"topics must be a non-empty list of non-empty names, got {topics!r}")
        self.topics = topics
        self.batch_size = _check_int("batch_size", batch_size, 1, 10_000)
        self.concurrency = _check_int("concurrency", concurrency, 1, 1024)
        self.lease_seconds = _check_number("lease_seconds", lease_seconds, 0, 86400)
        self.poll_interval = _check_number("poll_interval", poll_interval, 0, 3600)
        super().__init__(self.poll_interval, max_backoff=max_reconnect_delay)
        self.retry: RetryPolicy = DEFAULT_RETRY if retry is None else as_policy(retry)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:relay{next(_names)}"
        self.handle_signals = handle_signals
        self.max_reconnect_delay = max_reconnect_delay
        self.listen = listen
        self.listener: Listener | None = None  # the last run()'s, with listen (tests read its counters)
        self.stats = RelayStats()
        self.idle = threading.Event()  # set while the last claim found nothing (tests wait on it)
        self._signals = Escalation(self._graceful, self._abort)
        self._stop_when_empty = False
        self._claimed = 0
        self._pool: cf.ThreadPoolExecutor | None = None
        self._lease: OutboxLease | None = None
        self._store: OutboxStore | None = None

    def __repr__(self) -> str:
        return f"Relay({self.name!r}, sink={self.sink!r}, lease={self.lease!r})"

    @property
    def who(self) -> str:
        return f"relay {self.name}"

    @property
    def store(self) -> OutboxStore:
        if self._store is None:
            self._store = self.app.outbox.store
        return self._store

    # ---- lifecycle (skiplock.lifecycle.Loop: one batch per pass) ---------------------------------

    def start(self, stop_when_empty: bool = False) -> "Relay":  # type: ignore[override]
        """Run in a background thread; returns once it has started."""
        if self._thread is not None and self._thread.is_alive():
            raise ConfigurationError("this relay is already running")
        self.handle_signals = False
        super().start(stop_when_empty=stop_when_empty)
        self.started.wait(30)
        return self

    def stop(self, timeout: float | None = 30.0) -> None:  # type: ignore[override]
        """Claim no more; the batch in hand is finished. Waits for a started thread to end."""
        super().stop(timeout)  # type: ignore[arg-type]

    def _graceful(self, name: str) -> None:
        log.warning("relay %s received %s: finishing the batch in hand, claiming no more (signal again to "
                    "abort)", self.name, name)
        self.stop()

    @staticmethod
    def _abort(name: str) -> None:
        raise KeyboardInterrupt

    def run(self, stop_when_empty: bool = False) -> RelayStats:  # type: ignore[override]
        """Relay until stopped (or, with ``stop_when_empty``, until nothing is available)."""
        _ = self.store  # clear error now if the database or schema is not usable
        self._stop.clear()  # a stopped relay can be run again
        self._stop_when_empty = stop_when_empty
        self.recovery = Reconnects(self.app.backend.dsn, log, cap=self.max_reconnect_delay)
        with Signals.install(self._signals, self.handle_signals):
            super().run()
        return self.stats

    def on_start(self) -> None:
        if self.app.metrics is not None:  # its delivery counters, read at scrape time (observability/metrics.py)
            self.app.metrics.attach(self)
        self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="skiplock-deliver")
        quiet_driver_noise()
        self.listener = None
        if self.listen and not self._stop_when_empty:
            store = self.store
            self.listener = Listener(store.connect_listener, store.wake_payload, lambda everyone: self.poke(),
                                     threading.Event(), self.max_reconnect_delay, recovery=self.recovery).start()

    def step(self) -> None:
        self._claimed = self.run_once()
        if self._claimed:
            self.idle.clear()
            return
        self.idle.set()
        if self._stop_when_empty:
            self._stop.set()

    def next_delay(self) -> float:
        return 0.0 if self._claimed else self.poll_interval

    def on_failure(self, exc: BaseException) -> None:
        self.stats.reconnects += 1
        self._close_lease()

    def on_stop(self) -> None:
        if self.app.metrics is not None:
            self.app.metrics.detach(self)
        if self.listener is not None:
            self.listener.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._close_lease()

    def _close_lease(self) -> None:
        if self._lease is not None:
            try:
                self._lease.close()
            finally:
                self._lease = None

    # ---- one batch -------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Claim, deliver and finish one batch; returns the number of messages claimed."""
        own_pool = self._pool is None  # called directly, outside run(): resources for this batch only
        if own_pool:
            self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="skiplock-deliver")
        try:
            return self._claimed_batch() if self.lease == "claimed" else self._transaction_batch()
        finally:
            if own_pool and self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
                self._close_lease()

    def _claimed_batch(self) -> int:
        owner = f"{self.name}/{uuid.uuid4().hex[:12]}"
        messages, rescued = self.store.claim_lease(owner, self.topics, self.batch_size, self.lease_seconds)
        if rescued:
            self.stats.rescued += rescued
            log.warning("relay %s: returned %d message(s) with an expired lease to the queue", self.name, rescued)
        if not messages:
            return 0
        results = self._delivered(messages, lambda: self._deliver_external(messages, owner))
        outcomes = [decide(m, r, self.retry) for m, r in zip(messages, results)]
        written = self._finish_with_retries(owner, outcomes)
        self._count(messages, outcomes, written)
        return len(messages)

    def _finish_with_retries(self, owner: str, outcomes: list[Finish]) -> set[int]:
        """The outcomes must reach the database before the lease ends, or the messages are delivered
        again: retry a lost connection a few times rather than give the batch up at once."""
        for wait in (0.25, 1.0, 2.0, None):
            try:
                return set(self.store.finish_lease(owner, outcomes))
            except (DatabaseError, DatabaseUnavailable) as exc:
                if wait is None:
                    raise
                log.warning("relay %s: could not write a batch's outcomes (%s); retrying", self.name, exc)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _transaction_batch(self) -> int:
        if self._lease is None or self._lease.closed:
            self._lease = self.store.open_lease(f"skiplock-relay {self.name}")
        lease = self._lease
        try:
            messages = lease.claim(self.topics, self.batch_size)
            if not messages:
                lease.rollback()
                return 0
            if self.transactional:
                results = self._delivered(messages, lambda: deliver_in_transaction(self.sink, lease, messages))
            else:
                results = self._delivered(messages, lambda: self._deliver_external(messages, None))
            outcomes = [decide(m, r, self.retry) for m, r in zip(messages, results)]
            written = set(lease.finish(outcomes))
            lease.commit()
        except BaseException:
            self._close_lease()  # the server rolls the batch back: every message is available again
            raise
        self._count(messages, outcomes, written)
        return len(messages)

    def _count(self, messages: list[Message], outcomes: list[Finish], written: set[int]) -> None:
        self.stats.batches += 1
        for m, o in zip(messages, outcomes):
            if m.id not in written:
                self.stats.lost += 1
                log.warning("relay %s: message %s: lease lost before its outcome (%s) was written; another relay "
                            "has it now (it may be delivered again)", self.name, m.id, o.state)
            elif o.state == "sent":
                self.stats.sent += 1
            elif o.state == "pending":
                self.stats.retried += 1
                log.warning("message %s (%s): %s; retry in %.1fs", m.id, m.topic, (o.error or "").splitlines()[0],
                            o.delay or 0.0)
            else:
                self.stats.failed += 1
                log.error("message %s (%s) failed: %s", m.id, m.topic, (o.error or "").splitlines()[0])

    # ---- delivering (outbox/delivery.py) --------------------------------------------------------

    def _delivered(self, messages: list[Message],
                   deliver: Callable[[], list[BaseException | None]]) -> list[BaseException | None]:
        """``deliver()``, in an outbox deliver span when tracing is on (observability/tracing.py)."""
        tracing = self.app.tracing
        if tracing is None:
            return deliver()
        try:
            carriers = list(self.store.trace_contexts([m.id for m in messages]).values())
        except Exception as exc:  # noqa: BLE001 - tracing never stops a delivery: the span goes unlinked
            log.debug("trace contexts of the outbox messages not read: %s", exc)
            carriers = []
        with tracing.outbox_deliver(messages[0].topic, len(messages), carriers) as done:
            results = deliver()
            done(results)
        return results

    def _deliver_external(self, messages: list[Message], owner: str | None) -> list[BaseException | None]:
        assert self._pool is not None
        ids = [m.id for m in messages]
        extend = None if owner is None else (lambda: self._extend(owner, ids))
        return deliver_external(self.sink, self._pool, messages, extend, self.lease_seconds / 3)

    def _extend(self, owner: str, ids: list[int]) -> None:
        try:
            self.store.extend_lease(owner, ids, self.lease_seconds)
        except (DatabaseError, DatabaseUnavailable) as exc:
            log.warning("relay %s: could not extend a lease (%s)", self.name, exc)
