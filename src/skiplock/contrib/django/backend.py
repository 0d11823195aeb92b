"""``SkiplockBackend``: the Django Tasks framework's backend on skiplock.

``TASKS = {"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend", "QUEUES": [...],
"OPTIONS": {"DATABASE": "default", "SCHEMA": "skiplock", "MAX_ATTEMPTS": 1}}}``.

- ``task.enqueue(...)`` inserts a skiplock job on Django's connection of ``DATABASE``, in its current
  transaction: inside ``transaction.atomic()`` (or an ``ATOMIC_REQUESTS`` view) the job exists only if
  the block commits. The job's task is the Django task's ``module_path``; its args
  ``{"args": [...], "kwargs": {...}}`` (JSON: the framework's own rule).
- ``priority`` (-100..100, higher runs sooner) is skiplock's ``-priority`` (lower runs sooner);
  ``queue_name`` is the skiplock queue; ``run_after`` is ``run_at``.
- The result's id is the job id (a string); ``get_result`` reads the job: ``queued`` is READY,
  ``running`` RUNNING, ``done`` SUCCESSFUL (``return_value`` the job's result), ``failed`` and
  ``cancelled`` FAILED, ``errors`` one ``TaskError`` per recorded error (oldest first; skiplock keeps
  the last 20), ``worker_ids`` the last worker once per attempt.
- A worker (``manage.py skiplock worker``) runs the task under the transaction lease with this
  thread's Django connection bound to the lease (:func:`.connection.bound_to_lease`): the task's ORM
  writes commit with the job's completion, exactly once. ``MAX_ATTEMPTS`` (default 1, the framework's
  "an exception fails the task") allows retries with skiplock's backoff; a retried task is READY again.
- ``async def`` tasks are refused (``supports_async_task = False``): Django's ORM is synchronous and
  would leave the lease's thread.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone as dt_timezone
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from ...errors import JobNotFound
from ...job import Job, JobState
from . import runtime
from .compat import (BaseTaskBackend, InvalidTaskError, ResultDoesNotExist, Task, TaskContext, TaskError, TaskResult,
                     TaskResultStatus, task_enqueued, task_finished, task_started)
from .connection import bound_to_lease, psycopg_connection

STATUS = {JobState.QUEUED: TaskResultStatus.READY, JobState.BLOCKED: TaskResultStatus.READY,
          JobState.RUNNING: TaskResultStatus.RUNNING,
          JobState.DONE: TaskResultStatus.SUCCESSFUL, JobState.FAILED: TaskResultStatus.FAILED,
          JobState.CANCELLED: TaskResultStatus.FAILED}


class SkiplockBackend(BaseTaskBackend):
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]):
        super().__init__(alias, params)
        self.database = self.options.get("DATABASE", "default")
        self.schema = self.options.get("SCHEMA", "skiplock")
        self.max_attempts = self.options.get("MAX_ATTEMPTS", 1)

    @property
    def app(self) -> Any:
        """The project's shared skiplock App for this backend's database and schema."""
        return runtime.app_for(self.database, self.schema)

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        runtime.register(task.module_path, _handler(task.module_path, self.database, self.alias))

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        payload = {"args": list(args), "kwargs": dict(kwargs)}
        job_id = self.app.enqueue(task.module_path, payload, queue=task.queue_name, priority=-task.priority,
                                  run_at=task.run_after, max_attempts=self.max_attempts,
                                  conn=psycopg_connection(self.database))
        result = _result(task, str(job_id), self.alias, TaskResultStatus.READY, payload, enqueued_at=timezone.now())
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job = self.app.get_job(int(result_id))
        except (ValueError, TypeError, JobNotFound):
            raise ResultDoesNotExist(result_id) from None
        task = _task_of(job)
        if task is None:
            raise ResultDoesNotExist(result_id)
        return result_of(job, task, self.alias)


def _task_of(job: Job) -> Task | None:
    """The Django task a job runs (with the job's queue and priority), or None for another kind of job."""
    try:
        task = import_string(job.task)
    except ImportError:
        return None
    if not isinstance(task, Task):
        return None
    try:
        return task.using(queue_name=job.queue, priority=-job.priority)
    except InvalidTaskError:
        return task


def result_of(job: Job, task: Task, backend: str) -> TaskResult:
    """A job as the framework's ``TaskResult``."""
    payload = job.args if isinstance(job.args, dict) else {}
    attempts = job.attempts if job.worker else 0
    result = _result(task, str(job.id), backend, STATUS[JobState(job.state)], payload,
                     enqueued_at=job.created_at, started_at=job.started_at, last_attempted_at=job.started_at,
                     finished_at=job.finished_at, errors=[task_error(e.get("error", "")) for e in job.errors or []],
                     worker_ids=[job.worker] * attempts)
    if job.state == JobState.DONE:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _result(task: Task, result_id: str, backend: str, status: Any, payload: dict[str, Any],
            **fields: Any) -> TaskResult:
    values = {"enqueued_at": None, "started_at": None, "finished_at": None, "last_attempted_at": None,
              "errors": [], "worker_ids": [], **fields}
    known = TaskResult.__dataclass_fields__
    return TaskResult(task=task, id=result_id, status=status, args=list(payload.get("args", [])),
                      kwargs=dict(payload.get("kwargs", {})), backend=backend,
                      **{k: v for k, v in values.items() if k in known})


def task_error(text: str) -> TaskError:
    """A recorded skiplock error (``Type: message``, a blank line, the traceback) as a ``TaskError``:
    the exception's class path is read from the traceback's last line (``module.Class: message``,
    ``builtins.`` for a built-in); an error that is no exception's (a worker that gave up, a
    timeout) is ``builtins.Exception`` with the text as its traceback."""
    head, _, traceback = text.partition("\n\n")
    lines = [line for line in traceback.strip().splitlines() if line and not line.startswith(" ")]
    path = "builtins.Exception"
    if traceback and lines:
        name = lines[-1].split(":", 1)[0].strip()
        if name and all(part.isidentifier() for part in name.split(".")):
            path = name if "." in name else f"builtins.{name}"
    return TaskError(exception_class_path=path, traceback=traceback or head)


def _handler(module_path: str, database: str, backend: str) -> Any:
    """The skiplock handler of a Django task: the task's function, called with its args, this thread's
    Django connection bound to the lease (transaction lease; a claimed lease has no job.conn)."""

    def run_django_task(job: Job, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
        task = import_string(module_path)
        call_args, call_kwargs = list(args or []), dict(kwargs or {})
        running = _result(task, str(job.id), backend, TaskResultStatus.RUNNING, {"args": call_args,
                          "kwargs": call_kwargs}, enqueued_at=job.created_at, started_at=job.started_at,
                          last_attempted_at=datetime.now(dt_timezone.utc), worker_ids=[job.worker] * job.attempts)
        if task.takes_context:
            call_args.insert(0, TaskContext(task_result=running))
        task_started.send(SkiplockBackend, task_result=running)
        lease = job.conn
        try:
            if lease is None:
                value = task.call(*call_args, **call_kwargs)
            else:
                with bound_to_lease(lease, database):
                    value = task.call(*call_args, **call_kwargs)
        except BaseException:
            object.__setattr__(running, "status", TaskResultStatus.FAILED)
            task_finished.send(SkiplockBackend, task_result=running)
            raise
        value = json.loads(json.dumps(value))  # the framework's JSON rule (tuples become lists)
        object.__setattr__(running, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(running, "_return_value", value)
        task_finished.send(SkiplockBackend, task_result=running)
        return value

    run_django_task.__qualname__ = run_django_task.__name__ = f"django_task[{module_path}]"
    return run_django_task
