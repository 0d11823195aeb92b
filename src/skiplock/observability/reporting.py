"""What the worker reports about each job, once, in one place: log lines, user hooks, metrics.

The executor calls :meth:`JobReporter.started` just before a handler runs and
:meth:`JobReporter.finished` once a claim's outcomes are durable (after its COMMIT): a transaction
that never committed reports nothing, its jobs run again and report then.

Log lines (logger ``skiplock.worker``; no job arguments, results or DSNs in any of them):

- INFO, one per finished job: ``job 42 (send_email) done in 0.012s, attempt 1/5`` (also ``cancelled``,
  ``snoozed``, ``lease lost``);
- WARNING for an attempt that failed and will be retried (``retrying in 2s``);
- ERROR for a job that ends ``failed`` (its last attempt, or a job that could not run);
- DEBUG for claims and batches (``worker/loop.py``, ``worker/executor.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from ..job import Cancelled, Done, Failed, LeaseLost, Outcome, RetryLater, Snoozed
from .hooks import Hooks, JobEvent
from .logs import log_lines

if TYPE_CHECKING:
    from ..backend.base import ClaimedJob

log = logging.getLogger("skiplock.worker")

_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR


def first_line(text: str | None, limit: int = 500) -> str:
    """An error's first line (its ``Type: message``), bounded: tracebacks stay in the database."""
    if not text:
        return ""
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[:limit] + "..."


def outcome_name(outcome: Outcome) -> str:
    """The outcome label of metrics and events: done, retry, failed, cancelled, snoozed, lease_lost."""
    if isinstance(outcome, Done):
        return "done"
    if isinstance(outcome, RetryLater):
        return "retry"
    if isinstance(outcome, Failed):
        return "failed"
    if isinstance(outcome, Cancelled):
        return "cancelled"
    if isinstance(outcome, Snoozed):
        return "snoozed"
    return "lease_lost"


class JobReporter:
    """Reports jobs for one worker (shared by its slots; holds no per-job state)."""

    def __init__(self, hooks: Hooks, metrics: Any = None):
        self.hooks = hooks
        self.metrics = metrics

    @property
    def wants_start(self) -> bool:
        return self.metrics is not None or self.hooks.wants("start")

    def started(self, claimed: "ClaimedJob", attempt: int) -> None:
        if self.metrics is not None:
            self.metrics.job_started(claimed)
        if self.hooks.active:
            self.hooks.emit(JobEvent("start", claimed.id, claimed.task, claimed.queue, attempt, claimed.max_attempts))

    def handler_ended(self, claimed: "ClaimedJob") -> None:
        if self.metrics is not None:
            self.metrics.job_ended(claimed)

    def finished(self, jobs: "Sequence[ClaimedJob]", outcomes: Sequence[Outcome],
                 ran: "dict[int, tuple[int, float]]") -> None:
        """The durable outcomes of one claim, ``jobs[i]``'s being ``outcomes[i]``; ``ran``: job id ->
        (attempt, handler seconds) of the jobs whose handler ran. The INFO lines of a claim go out
        together (``log_lines``: one write when the worker's handler is ``configure_logging``'s), in
        order with its WARNING and ERROR lines."""
        hooks, metrics = self.hooks, self.metrics
        info = log.isEnabledFor(_INFO)
        quiet = not info and metrics is None and not hooks.active  # only failures have something to say
        counts: dict[tuple[str, str, str], int] = {}
        lines: list[str] = []  # INFO lines not written yet
        for claimed, outcome in zip(jobs, outcomes):
            done = type(outcome) is Done
            if quiet and done:
                continue
            attempt, seconds = ran.get(claimed.id, (claimed.attempts, None))
            name = "done" if done else outcome_name(outcome)
            if metrics is not None:
                key = (claimed.task, claimed.queue, name)
                counts[key] = counts.get(key, 0) + 1
                if seconds is not None:
                    metrics.job_duration(claimed, seconds)
            took = "" if seconds is None else f" in {seconds:.3f}s"
            error = None
            if not done:
                decided = outcome.attempted if isinstance(outcome, LeaseLost) else outcome
                error = getattr(decided, "error", None)
                if isinstance(decided, Cancelled):
                    error = decided.reason
            if isinstance(outcome, (Failed, RetryLater)):
                log_lines(log, _INFO, lines, "finished")  # what came before it, first
                lines.clear()
                if isinstance(outcome, Failed):
                    log.error("job %s (%s) failed%s, attempt %s/%s: %s", claimed.id, claimed.task, took,
                              attempt, claimed.max_attempts, first_line(error))
                else:
                    log.warning("job %s (%s) attempt %s/%s failed%s, retrying in %gs: %s", claimed.id,
                                claimed.task, attempt, claimed.max_attempts, took, outcome.delay, first_line(error))
            elif info:
                why = f": {first_line(error)}" if isinstance(outcome, Cancelled) else ""
                lines.append(f"job {claimed.id} ({claimed.task}) {name.replace('_', ' ')}{took}, "
                             f"attempt {attempt}/{claimed.max_attempts}{why}")
            if hooks.active:
                self._emit(claimed, attempt, seconds, name, outcome, error)
        log_lines(log, _INFO, lines, "finished")
        if counts:
            metrics.jobs_finished(counts)

    def _emit(self, claimed: "ClaimedJob", attempt: int, seconds: float | None, name: str, outcome: Outcome,
              error: str | None) -> None:
        emit = self.hooks.emit

        def event(kind: str) -> None:
            emit(JobEvent(kind, claimed.id, claimed.task, claimed.queue, attempt, claimed.max_attempts, seconds,
                          name, error))

        if isinstance(outcome, Done):
            event("success")
        elif isinstance(outcome, RetryLater):
            event("failure")
        elif isinstance(outcome, Failed):
            event("failure")
            event("dead")
        elif isinstance(outcome, Cancelled):
            event("cancel")
        elif isinstance(outcome, LeaseLost):
            event("lease_lost")


def enqueued(app: Any, jobs: "Sequence[Any]", ids: Sequence[int]) -> None:
    """Report jobs an enqueue call inserted (``jobs[i]``, a ``NewJob``, got ``ids[i]``): counted by
    task and queue, and the ``enqueue`` hooks. Only called when metrics or hooks are on."""
    metrics = app.metrics
    if metrics is not None:
        metrics.enqueued(jobs)
    hooks: Hooks = app.hooks
    if hooks.wants("enqueue"):
        for job, job_id in zip(jobs, ids):
            hooks.emit(JobEvent("enqueue", job_id, job.task, job.queue, 0, job.max_attempts))
