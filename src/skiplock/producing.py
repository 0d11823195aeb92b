"""Producing jobs: the checks and serialisation of :meth:`App.enqueue` / :meth:`App.enqueue_many`
(one definition of a valid job, checked before anything is sent), and the statements they run,
as steps any driver runs (the sync path here, AsyncApp's on an async connection)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generator, Iterable, Mapping

from .backend.base import Backend, NewJob
from .errors import DuplicateJob, InvalidJob
from .flow import MAX_PARTITION_CHARS, MAX_SEQUENCE_CHARS
from .retry import check_delay
from .values import MAX_QUEUE_CHARS, MAX_TASK_CHARS, MAX_UNIQUE_KEY_CHARS, _encode_compact, check_text, to_json

if TYPE_CHECKING:
    from .app import Task

Steps = Generator[Any, Any, Any]  # a backend's statement steps (see backend/postgres/steps.py)

INT32 = (-(2**31), 2**31 - 1)
# Matches the CHECK on jobs.run_at: every client can read these times back.
RUN_AT_RANGE = (datetime(1900, 1, 1, tzinfo=timezone.utc), datetime(9000, 1, 1, tzinfo=timezone.utc))


def _check_queue(queue: Any) -> str:
    return check_text("queue", queue, MAX_QUEUE_CHARS)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidJob(f"{name} must be an integer between {low} and {high}, got {value!r}")
    return value


# enqueue_many options that _new_jobs' shortcut handles (run_at and delay vary per job: no shortcut)
_PLAIN_OPTIONS = frozenset({"queue", "priority", "max_attempts"})
_ITEM_OPTIONS = frozenset({"queue", "priority", "run_at", "delay", "max_attempts", "unique_key", "on_conflict",
                           "partition", "sequence"})
ON_CONFLICT = ("return", "raise")
_STR_OR_NONE = (str, type(None))
_INT_OR_NONE = (int, type(None))
_only_str = frozenset({str}).issuperset


def _plain_args_json(args: dict[Any, Any], limit: int) -> str | None:
    """Exactly ``serialise_args(args, limit)`` for the common case -- a dict with str keys that
    encodes without error, holds no ``\\u0000`` escape and fits ``limit`` -- at a fraction of the
    cost; None for anything else, which then goes through serialise_args for its verdict."""
    if not args:
        return "{}" if limit >= 2 else None
    if not _only_str(map(type, args)):
        return None
    try:
        text = _encode_compact(args)
    except Exception:  # noqa: BLE001 - serialise_args names the problem
        return None
    if "\\u0000" in text:
        return None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return None
    return text if size <= limit else None


def serialise_args(args: Any, limit: int) -> str:
    """JSON text of a job's keyword arguments (a JSON object with string keys), or InvalidJob."""
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise InvalidJob(f"args must be a JSON object (a dict of keyword arguments), got {type(args).__name__}")
    for key in args:
        if not isinstance(key, str):
            raise InvalidJob(f"args keys must be strings (they become keyword arguments), got {key!r}")
    return to_json(args, "args", limit)


def _check_unique(unique_key: Any, on_conflict: Any, job: NewJob | None = None) -> str | None:
    """The unique key (None: none), or InvalidJob; ``on_conflict`` is checked even without a key.
    A job with a sequence cannot have one (a blocked job is neither queued nor running, which is
    what a unique key counts)."""
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        raise InvalidJob(f"on_conflict must be 'return' or 'raise', got {on_conflict!r}")
    key = check_text("unique_key", unique_key, MAX_UNIQUE_KEY_CHARS, optional=True)
    if key is not None and job is not None and job.sequence is not None:
        raise InvalidJob(f"a job with a sequence ({job.sequence!r}) cannot have a unique_key (not supported yet)")
    return key


def _enqueue_steps(backend: Backend, job: NewJob, unique_key: str | None, on_conflict: str) -> Steps:
    """What :meth:`App.enqueue` sends and decides once its input is checked, as steps that the sync
    driver (App.enqueue) and the async one (AsyncApp.enqueue on an AsyncConnection) both run."""
    if unique_key is None:
        return (yield from backend.enqueue_steps([job]))[0]
    job_id, created = yield from backend.enqueue_unique_steps(job, unique_key)
    if not created and on_conflict == "raise":
        raise DuplicateJob(f"job {job_id} already holds unique_key {unique_key!r}", job_id)
    return job_id


def _check_run_at(run_at: Any) -> datetime | None:
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidJob(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at.tzinfo is None:
        raise InvalidJob("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    try:
        utc = run_at.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not RUN_AT_RANGE[0] < utc < RUN_AT_RANGE[1]:
        raise InvalidJob(f"run_at must be between {RUN_AT_RANGE[0]:%Y} and {RUN_AT_RANGE[1]:%Y} (UTC), got {run_at.isoformat()}")
    return utc



def _partitioned(task: "Task | None") -> bool:
    """The task derives a key from its args (partition or sequence): no enqueue_many shortcut."""
    return task is not None and (task.partition_by is not None or task.sequence_by is not None)


def _derived_partition(task: "Task | None", args: Any) -> str | None:
    """A registered task's ``partition_by`` argument as the job's partition (flow control), stored
    so that a fair queue can order by it (jobs_fair_idx): its text as ``args ->> name`` gives it --
    a string as it is, an integer in decimal, a boolean as true/false. Another value (or an absent
    one) is left to the claim, which reads it from the args the same way."""
    if task is None or task.partition_by is None:
        return None
    return _arg_text(args, task.partition_by, MAX_PARTITION_CHARS)


def _derived_sequence(task: "Task | None", args: Any) -> str | None:
    """A registered task's ``sequence_by`` argument as the job's sequence key, as text the way
    :func:`_derived_partition` makes it. Absent (or another kind of value): InvalidJob -- a job of a
    sequenced task must say its sequence."""
    if task is None or task.sequence_by is None:
        return None
    text = _arg_text(args, task.sequence_by, MAX_SEQUENCE_CHARS)
    if text is None:
        raise InvalidJob(f"task {task.name!r} is sequenced by argument {task.sequence_by!r}: the job needs it "
                         "as a string, an integer or a boolean (or give sequence= explicitly)")
    return text


def _arg_text(args: Any, name: str, limit: int) -> str | None:
    if not isinstance(args, Mapping):
        return None
    value = args.get(name)
    if isinstance(value, bool):
        text: str | None = "true" if value else "false"
    elif isinstance(value, (str, int)):
        text = str(value)
    else:
        text = None
    return text if text is not None and 0 < len(text) <= limit and "\x00" not in text else None


class Producer:
    """App's producing half (mixed into :class:`App`): the checks behind ``enqueue`` and
    ``enqueue_many`` (which App defines itself)."""

    tasks: "dict[str, Task]"
    max_args_bytes: int

    @property
    def backend(self) -> Backend:  # App's
        raise NotImplementedError

    def _ready(self) -> Backend:  # App's
        raise NotImplementedError

    # ---- producing ---------------------------------------------------------------------------

    def _new_job(self, task: str, args: Any, queue: str | None, priority: int | None, run_at: datetime | None,
                 delay: float | timedelta | None, max_attempts: int | None, partition: str | None = None,
                 sequence: str | None = None) -> NewJob:
        check_text("task", task, MAX_TASK_CHARS)
        registered = self.tasks.get(task)
        if delay is not None:
            if run_at is not None:
                raise InvalidJob("give run_at or delay, not both")
            try:
                seconds = check_delay(delay.total_seconds() if isinstance(delay, timedelta) else delay, "delay")
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None
            run_at = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        sequence = (check_text("sequence", sequence, MAX_SEQUENCE_CHARS) if sequence is not None
                    else _derived_sequence(registered, args))
        return NewJob(
            task=task,
            args_json=serialise_args(args, self.max_args_bytes),
            queue=_check_queue(queue if queue is not None else (registered.queue if registered else "default")),
            priority=_check_int("priority", priority if priority is not None else (registered.priority if registered else 0), *INT32),
            max_attempts=_check_int("max_attempts", max_attempts if max_attempts is not None else (registered.max_attempts if registered else 5), 1, INT32[1]),
            run_at=_check_run_at(run_at),
            partition=check_text("partition", partition, MAX_PARTITION_CHARS, optional=True)
            if partition is not None else _derived_partition(registered, args),
            sequence=sequence,
            sequence_on_failure=None if sequence is None else (registered.sequence_on_failure if registered else "wait"),
        )

    def _new_jobs(self, jobs: Iterable[Any]) -> tuple[list[NewJob], dict[int, tuple[str, str]]]:
        """Check ``enqueue_many`` items: the jobs to insert and ``{item index: (unique_key,
        on_conflict)}`` for the items with a key, or InvalidJob naming the first bad item.

        :meth:`_new_job` is the one definition of a valid job; this only avoids repeating its work.
        An item ``(task, args)`` or ``(task, args, {queue/priority/max_attempts})`` with a plain dict
        of args takes a shortcut once an item of the same task and options (same values, same exact
        types) has been through _new_job in this call: the checked queue, priority and max_attempts
        are reused, and :func:`_plain_args_json` encodes the args (deferring to serialise_args for
        anything unusual). Same jobs, same errors, 2-4 times less Python per item."""
        new: list[NewJob] = []
        keyed: dict[int, tuple[str, str]] = {}
        append = new.append
        limit = self.max_args_bytes
        checked: dict[tuple[str, str | None, int | None, int | None], tuple[str, int, int]] = {}
        for i, item in enumerate(jobs):
            key = None
            if type(item) is tuple:
                if len(item) == 2:
                    task, args = item
                    if type(task) is str and not _partitioned(self.tasks.get(task)):
                        key = (task, None, None, None)
                elif len(item) == 3 and type(item[2]) is dict and item[2].keys() <= _PLAIN_OPTIONS:
                    task, args, options = item
                    queue, priority, attempts = options.get("queue"), options.get("priority"), options.get("max_attempts")
                    # exact types only: True == 1 and 1.0 == 1 as dict keys, but neither is a valid priority
                    if type(task) is str and not _partitioned(self.tasks.get(task)) and type(queue) in _STR_OR_NONE and type(priority) in _INT_OR_NONE \
                            and type(attempts) in _INT_OR_NONE:
                        key = (task, queue, priority, attempts)
                if key is not None and type(args) is dict:
                    known = checked.get(key)
                    if known is not None:
                        text = _plain_args_json(args, limit)
                        if text is not None:
                            append(NewJob(task, text, known[0], known[1], known[2], None))
                            continue
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise InvalidJob(f"item {i}: expected (task, args) or (task, args, options), got {item!r}")
            options = dict(item[2]) if len(item) == 3 else {}
            unknown = set(options) - _ITEM_OPTIONS
            if unknown:
                raise InvalidJob(f"item {i}: unknown options {sorted(unknown)}")
            try:
                job = self._new_job(item[0], item[1], options.get("queue"), options.get("priority"),
                                    options.get("run_at"), options.get("delay"), options.get("max_attempts"),
                                    options.get("partition"), options.get("sequence"))
                on_conflict = options.get("on_conflict", "return")
                unique_key = _check_unique(options.get("unique_key"), on_conflict, job)
            except InvalidJob as exc:
                raise InvalidJob(f"item {i}: {exc}") from None
            append(job)
            if unique_key is not None:
                keyed[i] = (unique_key, on_conflict)
            if key is not None:
                checked[key] = (job.queue, job.priority, job.max_attempts)
        if keyed and any(j.sequence is not None for j in new):
            raise InvalidJob("a batch with unique keys cannot hold jobs with a sequence (not supported yet): "
                             "enqueue them in separate calls")
        return new, keyed

