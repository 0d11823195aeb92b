"""``skiplock worker --stop-when-empty``: drain, then wait for what is due soon, then say what is left.

A worker told to stop when empty stops at the first moment no job is available *now*. A job whose
attempt just failed is queued again with a backoff delay (seconds, by default), so stopping there
would leave it behind silently. :func:`drain` therefore looks, after each drain, at the queued jobs
this worker could take (its tasks, its queues) that are not due yet: if the next one is due within
``horizon`` seconds it waits for it and drains again; otherwise it stops, and :func:`left_behind`
says what it left (how many, and when the next is due) -- and which ready jobs sit in paused queues.

How far it looks: the newest :data:`SCAN_LIMIT` queued jobs of each served queue (of all queues
when the worker serves every queue); past that the count says "at least".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..app import App
    from ..worker import Worker

SCAN_LIMIT = 10_000
PAGE = 1_000


@dataclass(frozen=True)
class Later:
    """Queued jobs this worker could take that are not due yet: how many, and the next one's time."""

    count: int
    next_at: datetime | None
    more: bool  # the scan stopped at SCAN_LIMIT: at least ``count``


def later_jobs(app: App, queues: Sequence[str] | None) -> Later:
    """The queued jobs of ``app``'s tasks in ``queues`` (None: all) whose ``run_at`` is in the future."""
    tasks = set(app.tasks)
    now = datetime.now(timezone.utc)
    count, next_at, more = 0, None, False
    served: Sequence[str | None] = queues or [None]
    for queue in served:
        seen, before = 0, None
        while seen < SCAN_LIMIT:
            page = app.list_jobs(state="queued", queue=queue, limit=PAGE, before=before)
            for job in page:
                if job.task in tasks and job.run_at is not None and job.run_at > now:
                    count += 1
                    next_at = job.run_at if next_at is None else min(next_at, job.run_at)
            seen += len(page)
            if len(page) < PAGE:
                break
            before = page[-1].id
        else:
            more = True
    return Later(count, next_at, more)


def drain(app: App, queues: Sequence[str] | None, horizon: float, run_once: Callable[[], Any],
          stopping: Callable[[], bool], log: Any) -> list[Any]:
    """Run ``run_once()`` (one drain: a worker's ``run(stop_when_empty=True)``) until nothing this
    worker could take is due within ``horizon`` seconds; return each run's stats. Between runs it
    sleeps until the next job is due (never longer than ``horizon``); SIGINT/SIGTERM then end it at
    once (nothing is in flight between runs). ``stopping()``: a run was told to stop (a signal)."""
    runs = [run_once()]
    while horizon > 0 and not stopping() and not getattr(runs[-1], "aborted", False):
        later = later_jobs(app, queues)
        if later.next_at is None:
            break
        wait = (later.next_at - datetime.now(timezone.utc)).total_seconds()
        if wait > horizon:
            break
        log.info("waiting %.1f s for %d queued job(s) due soon (retries or delays) before stopping",
                 max(0.0, wait), later.count)
        if _interruptible_sleep(max(0.0, wait) + 0.05):
            log.info("received a signal while waiting: stopping")
            break
        runs.append(run_once())
    return runs


def _interruptible_sleep(seconds: float) -> bool:
    """Sleep; True if SIGINT or SIGTERM came meanwhile (the previous handlers are put back)."""
    import signal
    import threading

    woken = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return woken.wait(seconds)
    previous = {s: signal.signal(s, lambda *_: woken.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return woken.wait(seconds)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass(frozen=True)
class Totals:
    """The counts of every drain of one ``--stop-when-empty`` run (a worker's stats, summed)."""

    done: int
    retried: int
    failed: int
    aborted: bool


def drain_until_quiet(app: App, first: "Worker", make_worker: Callable[[], "Worker"], queues: Sequence[str] | None,
                      horizon: float, log: Any) -> Totals:
    """``worker --stop-when-empty``: :func:`drain` with ``first`` (a Worker runs once: each further
    drain is a new one from ``make_worker``), then log what was left behind (unless aborted)."""
    workers = [first]

    def run_once() -> Any:
        if workers[-1].started.is_set():
            workers.append(make_worker())
        return workers[-1].run(stop_when_empty=True)

    def signalled() -> bool:  # a run told to stop by SIGINT/SIGTERM (the worker counts its signals) ends it
        return any(w.stats.aborted or w.signals_received for w in workers)

    runs = drain(app, queues, horizon, run_once, signalled, log)
    totals = Totals(sum(r.done for r in runs), sum(r.retried for r in runs), sum(r.failed for r in runs),
                    any(r.aborted for r in runs))
    if not totals.aborted:
        for line in left_behind(app, queues):  # INFO: stopping when empty left them on purpose
            log.info("%s", line)
    return totals


def left_behind(app: App, queues: Sequence[str] | None) -> list[str]:
    """What a worker that stopped when empty leaves behind, as lines for its log ([] if nothing)."""
    from .formatting import took, when

    lines = []
    later = later_jobs(app, queues)
    if later.count:
        wait = (later.next_at - datetime.now(timezone.utc)) if later.next_at is not None else None
        lines.append(f"left behind: {'at least ' if later.more else ''}{later.count} queued job(s) of this app's "
                     f"tasks due later (the next at {when(later.next_at)}, in {took(wait)}); run a worker then, "
                     "or see `skiplock jobs --state queued`")
    for q in app.read_model.oldest_ready():
        if q.paused and (queues is None or q.queue in queues):
            lines.append(f"left behind: {q.ready} ready job(s) in paused queue {q.queue!r} "
                         f"(`skiplock resume {q.queue}`)")
    return lines
