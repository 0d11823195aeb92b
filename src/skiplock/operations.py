"""App's reads and operations on jobs and queues (mixed into :class:`App`): get and list jobs,
counts, cancel, retry, pause and resume queues, wait for a job, prune finished jobs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .backend.base import Backend
from .errors import (ConfigurationError, DatabaseUnavailable, DuplicateJob, InvalidJob, JobFailed, JobNotFound,
                     UnknownQueue, WaitTimeout)
from .flow import NOT_SUPPORTED, check_concurrency, check_weights, format_rate, parse_rate
from .job import Job, JobState
from .producing import _check_int, _check_queue
from .settings import _check_retention
from .values import MAX_QUEUE_CHARS, MAX_TASK_CHARS, check_text

if TYPE_CHECKING:
    from .app import Task
    from .readmodel import ReadModel

FINISHED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class RetriedJobs(list):  # type: ignore[type-arg]  # list[int]
    """What :meth:`App.retry_failed` returns: the ids of the jobs put back (it is that list), and
    ``not_retried``, {job id: :class:`DuplicateJob`} for each failed job that stays failed because its
    unique key is held (``str(error)`` says by which job; ``error.existing_id`` is that job's id)."""

    def __init__(self, ids: Iterable[int] = ()):
        super().__init__(ids)
        self.not_retried: dict[int, DuplicateJob] = {}


def _held_message(job_id: int, unique_key: str | None, holder: int, state: str | None = None) -> str:
    how = f" ({state})" if state else " (queued or running)"
    return (f"job {job_id} cannot be retried: job {holder} holds its unique_key {unique_key!r}{how}; "
            "retry it once that job has finished")



class Operations:
    """Reads and operations of :class:`App` (see each method)."""

    tasks: "dict[str, Task]"
    retention: dict[str, float]

    def _ready(self) -> Backend:  # App's
        raise NotImplementedError

    # ---- reading -----------------------------------------------------------------------------

    @staticmethod
    def _job(row: Mapping[str, Any]) -> Job:
        data = dict(row)
        data["state"] = JobState(data["state"])
        return Job(**data)

    def get_job(self, job_id: int) -> Job:
        """The job as stored, except that a transaction-lease job in flight (its row says ``queued``
        while its lease transaction runs the handler) is shown ``running``, with its attempt, slot
        (``worker``) and start (``started_at``); see :mod:`skiplock.readmodel` for exactly when."""
        row = self._ready().get_job(job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        return self._job(row)

    def list_jobs(self, *, state: str | None = None, queue: str | None = None, task: str | None = None,
                  limit: int = 50, before: int | None = None) -> list[Job]:
        """Jobs newest first, at most ``limit``; the next page: ``before=`` the last id of this one
        (keyset pagination: a job enqueued or deleted meanwhile never makes a page repeat or skip a
        row). States as :meth:`get_job` shows them: ``state="running"`` lists every job in flight,
        whichever its lease (see :mod:`skiplock.readmodel`), and ``"queued"`` leaves them out."""
        if state is not None:
            try:
                state = JobState(state).value
            except ValueError:
                raise InvalidJob(f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}") from None
        check_text("queue", queue, MAX_QUEUE_CHARS, optional=True)  # a filter no job can match is a mistake
        check_text("task", task, MAX_TASK_CHARS, optional=True)
        _check_int("limit", limit, 1, 100_000)
        if before is not None:
            _check_int("before", before, 1, 2**63 - 1)
        return [self._job(r) for r in self._ready().list_jobs(state=state, queue=queue, task=task, limit=limit,
                                                              before=before)]

    def counts(self) -> list[tuple[str, str, int]]:
        """(queue, state, count) for every queue and state that has jobs; a transaction-lease job in
        flight counts as ``running`` (see :mod:`skiplock.readmodel`)."""
        return self._ready().counts()

    @property
    def read_model(self) -> "ReadModel":
        """What is running, who runs it, what failed, what waits: :class:`skiplock.readmodel.ReadModel`."""
        from .readmodel import ReadModel

        return ReadModel(self._ready())

    def live_workers(self) -> int:
        """How many workers are running: seen in the last ``presence.LIVE_SECONDS`` seconds."""
        from .worker.presence import LIVE_SECONDS

        return self._ready().live_workers(LIVE_SECONDS)

    def untakeable_jobs(self) -> list[tuple[str, str, int]]:
        """(queue, task, count) of queued jobs that no running worker can take: no worker seen in the
        last ``presence.LIVE_SECONDS`` seconds has the task registered and serves the queue. (A worker
        claims only its own tasks; these jobs wait, untouched, for one that knows them.)"""
        from .worker.presence import LIVE_SECONDS

        return self._ready().untakeable(LIVE_SECONDS)

    # ---- lifecycle -----------------------------------------------------------------------------

    def cancel_job(self, job_id: int, reason: str = "cancelled by request", wait: float = 10.0) -> JobState:
        """Cancel a job and return its state. A queued job is cancelled at once and never runs. A
        job running in a transaction lease is told by ending its session: its transaction rolls back
        (its database effects vanish) and it ends ``cancelled``. A job that already finished keeps
        its state (returned) -- except a failed job still holding its sequence (the rule 'wait',
        docs/flow-control.md): it is cancelled, and the sequence goes on. If the running handler does not let go within ``wait`` seconds, the
        request stays recorded and the job ends cancelled as soon as it does; a finishing ``done``
        write never overwrites a cancellation."""
        check_text("reason", reason, 10_000)
        backend = self._ready()
        state = backend.request_cancel(job_id, reason)
        if state is None:
            raise JobNotFound(f"no job with id {job_id}")
        deadline = time.monotonic() + wait
        while True:
            if backend.cancel_if_unlocked(job_id) or backend.cancel_running(job_id):
                return JobState.CANCELLED
            current = self.get_job(job_id).state
            if current in FINISHED:
                if current != JobState.CANCELLED:
                    backend.forget_cancel_request(job_id)
                if current == JobState.FAILED and backend.cancel_failed_head(job_id, reason):
                    return JobState.CANCELLED  # it held its sequence (rule 'wait'): the sequence goes on
                return current
            backend.end_lease_holder(job_id)
            if time.monotonic() > deadline:
                return current
            time.sleep(0.02)

    def retry_job(self, job_id: int) -> None:
        """Put a failed (or cancelled) job back in the queue with fresh attempts; its errors are kept.
        Raises JobNotFound, InvalidJob (the job is not failed or cancelled) or :class:`DuplicateJob`
        (``existing_id``: the queued or running job that holds its unique key now; retry it once that
        job has finished)."""
        backend = self._ready()
        for _ in range(10):  # the holder may finish between the refusal and the lookup: try again
            if backend.retry_job(job_id):
                return
            job = self.get_job(job_id)  # JobNotFound if it does not exist
            if job.state not in (JobState.FAILED, JobState.CANCELLED):
                raise InvalidJob(f"job {job_id} is {job.state}; only failed or cancelled jobs can be retried")
            holder = backend.unique_key_holder(job.unique_key) if job.unique_key is not None else None
            if holder is not None:
                raise DuplicateJob(_held_message(job_id, job.unique_key, *holder), holder[0])
        raise DatabaseUnavailable(f"the unique key of job {job_id} kept changing hands; try again")

    def retry_failed(self, queue: str | None = None) -> "RetriedJobs":
        """Put every failed job (of ``queue``) back, in one statement; returns the ids retried (a
        list, in id order). A job whose unique key is held -- by a queued or running job, or by an
        earlier failed job with the same key retried here -- stays failed, and is in the result's
        ``not_retried``: {job id: :class:`DuplicateJob` saying why, ``existing_id`` the holder}."""
        retried = RetriedJobs()
        for job_id, unique_key, ok, holder in self._ready().retry_failed(queue):
            if ok:
                retried.append(job_id)
            elif holder is not None:
                retried.not_retried[job_id] = DuplicateJob(_held_message(job_id, unique_key, holder), holder)
            else:  # retried by someone else meanwhile
                retried.not_retried[job_id] = DuplicateJob(f"job {job_id} is no longer failed", None)
        return retried

    def pause_queue(self, queue: str, *, force: bool = False) -> None:
        """Stop workers claiming from ``queue`` (they honour it at their next claim, no restart).
        Jobs already running finish. Unknown queues are refused unless ``force``."""
        _check_queue(queue)
        backend = self._ready()
        if not force and not backend.queue_known(queue) and queue not in {t.queue for t in self.tasks.values()}:
            raise UnknownQueue(f"unknown queue {queue!r}: no job has used it (use force=True / --force to pause it "
                               "before it is used)")
        backend.pause_queue(queue)

    def resume_queue(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again; False if it was not paused."""
        return self._ready().resume_queue(_check_queue(queue))

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with jobs, paused or limited: ``{"queue", "paused", "counts": {state: n},
        "limits": {"concurrency", "rate", "fair", "weights"} or None}`` (flow control:
        :meth:`set_queue_limits`)."""
        backend = self._ready()
        paused = set(backend.paused_queues())
        limits = {q["queue"]: {"concurrency": q["concurrency"], "rate": q["rate"], "fair": q["fair"],
                               "weights": q["weights"]}
                  for q in self.queue_limits()}
        out: dict[str, dict[str, Any]] = {q: {"queue": q, "paused": q in paused, "counts": {}}
                                          for q in paused | set(limits)}
        for queue, state, n in backend.counts():
            out.setdefault(queue, {"queue": queue, "paused": queue in paused, "counts": {}})["counts"][state] = n
        for q in out.values():
            q["limits"] = limits.get(q["queue"])
        return [out[q] for q in sorted(out)]

    def set_queue_limits(self, queue: str, *, concurrency: int | None = None, rate: str | None = None,
                         fair: bool = False, weights: Mapping[str, int] | None = None) -> None:
        """Flow control for a whole queue (docs/flow-control.md): at most ``concurrency`` of its jobs
        running at once and ``rate`` (``"100/min"``) starts, across every worker; None: no such
        limit. ``fair``: claims go round-robin across the queue's partitions (a partition with a
        million jobs does not delay one with one). ``weights``: ``{partition: w}`` for a fair queue
        -- a partition of weight w gets w times the claims of one of weight 1 (the default) while
        both have ready jobs. All of them replace what was set (none: the queue is unlimited again). Running workers honour a change at their next claim, no restart. Not on
        MySQL/MariaDB (ConfigurationError)."""
        _check_queue(queue)
        concurrency = check_concurrency(concurrency)
        parsed = None if rate is None else parse_rate(rate)
        backend = self._ready()
        if not backend.capabilities.flow_control:
            raise ConfigurationError(f"queue limits {NOT_SUPPORTED}")
        if not isinstance(fair, bool):
            raise ConfigurationError(f"fair must be True or False, got {fair!r}")
        checked = check_weights(weights)
        if checked and not fair:
            raise ConfigurationError("weights apply to a fair queue: give fair=True with them")
        backend.set_queue_limit(queue, concurrency, parsed, fair, checked)  # type: ignore[attr-defined]  # base.FlowBackend

    def set_task_limits(self, task: str, *, concurrency: int | None = None, rate: str | None = None,
                        clear: bool = False) -> None:
        """A task's limits changed at runtime (docs/flow-control.md): they replace the ones in its
        code (``@app.task(concurrency=, rate=)``; None: no such limit, the code's too) in every
        worker that has the task, within a second, without a restart; its ``partition_by`` still
        applies. ``clear=True``: back to the code's limits. Not on MySQL/MariaDB (ConfigurationError)."""
        check_text("task", task, MAX_TASK_CHARS)
        concurrency = check_concurrency(concurrency)
        parsed = None if rate is None else parse_rate(rate)
        if clear and (concurrency is not None or parsed is not None):
            raise ConfigurationError("give clear=True or limits, not both")
        backend = self._ready()
        if not backend.capabilities.flow_control:
            raise ConfigurationError(f"task limits {NOT_SUPPORTED}")
        backend.set_task_limit(task, concurrency, parsed, clear)  # type: ignore[attr-defined]  # base.FlowBackend

    def task_limits(self) -> list[dict[str, Any]]:
        """The tasks with limits set at runtime: ``{"task", "concurrency", "rate", "rate_count",
        "rate_period", "updated_at"}`` by task (none on a backend without flow control)."""
        backend = self._ready()
        if not backend.capabilities.flow_control:
            return []
        return [{"task": t, "concurrency": c, "rate": None if n is None else format_rate(n, p), "rate_count": n,
                 "rate_period": p, "updated_at": at}
                for t, c, n, p, at in backend.task_limits()]  # type: ignore[attr-defined]  # base.FlowBackend

    def clearing_queue_limits(self) -> list[str]:
        """The queues whose limits were cleared while some of their jobs were in flight (or being
        enqueued): they keep a row without limits, served by the workers' flow claim, until those end
        -- every worker's maintenance pass then deletes it (docs/flow-control.md, "Which index each
        claim walks"). Empty on a backend without flow control."""
        backend = self._ready()
        if not backend.capabilities.flow_control:
            return []
        return backend.retiring_queues()  # type: ignore[attr-defined, no-any-return]  # base.FlowBackend

    def queue_limits(self) -> list[dict[str, Any]]:
        """The queues with limits: ``{"queue", "concurrency", "rate" ("100/min"), "rate_count",
        "rate_period" (seconds), "fair", "weights", "updated_at"}``, by queue (none on a backend without flow control)."""
        backend = self._ready()
        if not backend.capabilities.flow_control:
            return []
        return [{"queue": q, "concurrency": c, "rate": None if n is None else format_rate(n, p), "rate_count": n,
                 "rate_period": p, "fair": fair, "weights": dict(weights or {}), "updated_at": at}
                for q, c, n, p, at, fair, weights in backend.queue_limits()]  # type: ignore[attr-defined]  # base.FlowBackend

    def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Block until the job finishes; return its result, or raise :class:`JobFailed` (failed or
        cancelled) or :class:`WaitTimeout`. Woken by LISTEN/NOTIFY on the fixed channel ``skiplock``
        (the finishing write notifies only jobs someone waits on), with a 1 s re-check as fallback."""
        backend = self._ready()
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = backend.connect_listener()
        try:
            backend.add_waiter(job_id)
            while True:
                job = self.get_job(job_id)
                if job.state == JobState.DONE:
                    return job.result
                if job.state in FINISHED:
                    first_line = (job.last_error or "").splitlines()[0] if job.last_error else ""
                    raise JobFailed(f"job {job_id} ended {job.state}: {first_line}", job)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeout(f"job {job_id} did not finish within {timeout}s (it is {job.state})")
                wait_for = 1.0 if remaining is None else min(1.0, remaining)
                listener.wait(wait_for)
        finally:
            try:
                backend.remove_waiter(job_id)
            finally:
                listener.close()

    def prune(self, retention: Mapping[str, float | timedelta] | None = None, batch: int = 1000) -> dict[str, int]:
        """Delete finished jobs older than their state's retention, in small batches that never lock
        the queue (SKIP LOCKED) and one process at a time (an advisory lock). Returns counts deleted;
        a state is absent if another process was pruning.

        This deletes everything due at once (``skiplock prune``, a manual call); the worker's
        background pruner paces itself instead (:class:`skiplock.maintenance.pruner.Pruner`)."""
        ages = self.retention if retention is None else _check_retention(retention)
        return self._prune(ages, batch)

    def _prune(self, ages: Mapping[str, float], batch: int, limit: int | None = None,
               ticks: bool = True) -> dict[str, int]:
        """One prune: each state in turn, batch by batch, until a batch comes back short or (with
        ``limit``) that many rows in all were deleted; a state the limit left unvisited is absent,
        as is one another process was pruning. ``ticks``: also prune old periodic ticks and the
        rows of dead batches."""
        backend = self._ready()
        deleted: dict[str, int] = {}
        left = limit
        for state, age in ages.items():
            total = 0
            while left is None or left > 0:
                size = batch if left is None else min(batch, left)
                n = backend.prune(state, age, size)
                if n is None:  # another process is pruning
                    break
                total += n
                if left is not None:
                    left -= n
                if n < size or left == 0:
                    deleted[state] = total
                    break
        if ticks:
            backend.prune_ticks(max(ages.values(), default=86400.0) + 86400.0)
        return deleted

