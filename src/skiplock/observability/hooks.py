"""User hooks: plain callables called with a :class:`JobEvent` when something happened to a job.

Register them on the App: ``app.on("success", fn)`` or, as a decorator, ``@app.on("failure")``.
Events (``EVENTS``): ``enqueue``, ``start``, ``success``, ``failure`` (each failed attempt, retried or
not), ``dead`` (the job ended ``failed``: its final failure; ``failure`` fires for it too),
``cancel`` and ``lease_lost`` (a claimed-lease job's finishing write was refused: it was rescued or
cancelled meanwhile).

Guarantees:

- **After the fact.** ``success``/``failure``/``dead``/``cancel``/``lease_lost`` are emitted once the
  job's outcome is durable (after the COMMIT that wrote it); a transaction that never committed emits
  nothing (the job runs again, and its next run emits). ``enqueue`` is emitted when the job's insert
  committed -- with ``enqueue(..., conn=your_conn)`` when the insert was made in your transaction,
  which may still roll back (skiplock cannot see your COMMIT). ``start`` is emitted just before the
  handler is called.
- **Never in the job's way.** Hooks run on one dispatcher thread per App, never on the slot that
  holds the lease: emitting is a non-blocking put on a bounded queue, so a slow hook cannot hold a
  lease open, and a raising hook cannot touch a job's transaction. A hook that raises is logged once
  (ERROR, with its traceback; later raises of the same hook are counted, not logged) and ignored. If
  the queue is full (hooks slower than the jobs), events are dropped and counted (``dropped``), with
  one WARNING per episode.
- **Order.** Events of one worker slot are dispatched in the order they were emitted; one hook is
  never called concurrently with itself.
- **Nothing when unused.** With no hook registered ``active`` is false and the worker does no
  per-job work for hooks.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("skiplock.hooks")

EVENTS = ("enqueue", "start", "success", "failure", "dead", "cancel", "lease_lost")
QUEUE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What happened to one job (immutable). ``attempt`` is the attempt it concerns (0 for
    ``enqueue``); ``duration`` the handler's seconds (None when no handler ran: ``enqueue``,
    ``start``, a job failed or cancelled before it ran); ``outcome`` one of ``done``, ``retry``,
    ``failed``, ``cancelled``, ``snoozed``, ``lease_lost`` (None for ``enqueue``/``start``);
    ``error`` the attempt's error text (a failure), or the cancel reason."""

    event: str
    job_id: int
    task: str
    queue: str
    attempt: int = 0
    max_attempts: int = 0
    duration: float | None = None
    outcome: str | None = None
    error: str | None = None


Hook = Callable[[JobEvent], Any]


class Hooks:
    """An App's registered hooks and their dispatcher thread (started at the first event emitted)."""

    def __init__(self) -> None:
        self._hooks: dict[str, tuple[Hook, ...]] = {}
        self.active = False
        self.dropped = 0
        self.raised = 0
        self._raised_once: set[int] = set()
        self._queue: "queue.Queue[tuple[Hook, JobEvent] | None]" = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._overflowing = False

    def on(self, event: str, fn: Hook | None = None) -> Any:
        """Register ``fn`` for ``event`` (one of ``EVENTS``); returns ``fn``. Without ``fn``, a
        decorator. Raises ValueError for an unknown event name, TypeError for a non-callable."""
        if event not in EVENTS:
            raise ValueError(f"unknown hook event {event!r}; expected one of: {', '.join(EVENTS)}")

        def register(hook: Hook) -> Hook:
            if not callable(hook):
                raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
            with self._lock:
                self._hooks[event] = self._hooks.get(event, ()) + (hook,)
                self.active = True
            return hook

        return register if fn is None else register(fn)

    def wants(self, event: str) -> bool:
        return event in self._hooks

    def emit(self, event: JobEvent) -> None:
        """Queue ``event`` for its hooks (non-blocking; never raises)."""
        hooks = self._hooks.get(event.event)
        if not hooks:
            return
        if self._thread is None:
            self._start()
        for hook in hooks:
            try:
                self._queue.put_nowait((hook, event))
                self._overflowing = False
            except queue.Full:
                self.dropped += 1
                if not self._overflowing:
                    self._overflowing = True
                    log.warning("hook queue full (%d events): hooks are slower than the jobs; dropping events "
                                "until it drains (dropped so far: %d)", QUEUE_SIZE, self.dropped)

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every event emitted so far has been handed to its hooks (at most ``timeout``
        seconds). True if the queue drained. A worker calls it when it stops."""
        q = self._queue
        with q.all_tasks_done:
            return q.all_tasks_done.wait_for(lambda: q.unfinished_tasks == 0, timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._dispatch, name="skiplock-hooks", daemon=True)
                self._thread.start()

    def _dispatch(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                hook, event = item
                try:
                    hook(event)
                except BaseException:  # noqa: BLE001 - a hook never takes anything down
                    self.raised += 1
                    if id(hook) not in self._raised_once:
                        self._raised_once.add(id(hook))
                        log.exception("hook %s for %r raised (logged once; its later errors are ignored)",
                                      getattr(hook, "__qualname__", repr(hook)), event.event)
            finally:
                self._queue.task_done()
