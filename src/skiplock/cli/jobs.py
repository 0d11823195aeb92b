"""Job commands of the ``skiplock`` CLI: ``enqueue`` and ``jobs`` (the list, or one job in full).

``enqueue`` with an app (``--app`` or ``SKIPLOCK_APP``) applies the task's registered options, refuses
a task the app does not register and checks the args against the handler's signature before
anything is written; without one it warns that none of that happened."""

from __future__ import annotations

import inspect
import json
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..job import JobState
from .formatting import when
from .group import (APP_SEARCH, STATE_STYLE, Context, console, emit_json, fail, handle_errors, json_flag, json_option,
                    plain, warn)
from .params import DURATION
from .status import untakeable_jobs

if TYPE_CHECKING:
    from ..app import Task
    from ..job import Job


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        fail(f"--run-at must be an ISO 8601 time with a UTC offset (e.g. 2026-12-01T09:00:00+00:00), got {value!r}")
    if when.tzinfo is None:
        fail(f"--run-at needs a UTC offset (e.g. {value}+00:00)")
    return when


def check_args_against_handler(task: Task, args: Any) -> None:
    """A job whose args the handler cannot take would fail with TypeError on every attempt: refuse it
    now (exit 2). The handler is called as ``handler(job, **args)``."""
    if not isinstance(args, dict):
        return  # the App's own check says what is wrong
    try:
        signature = inspect.signature(task.fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    try:
        signature.bind(None, **args)
    except TypeError as exc:
        takes = ", ".join(_parameter(p) for p in list(signature.parameters.values())[1:]) or "no arguments"
        fail(f"task {task.name!r} cannot take these args: {exc} (its handler takes: {takes})")


def _parameter(p: inspect.Parameter) -> str:
    """``to: str``, ``cc: str | None = None``, ``**extra`` (annotations as written, quoted or not)."""
    stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
    text = stars + p.name
    if p.annotation is not p.empty:
        text += ": " + (p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__",
                                                                                    repr(p.annotation)))
    if p.default is not p.empty:
        text += f" = {p.default!r}"
    return text


@click.command()
@click.argument("task")
@click.option("--args", "args_json", default="{}", show_default=True, help="Keyword arguments as a JSON object.")
@click.option("--args-file", type=click.File("r", encoding="utf-8"), help="Read the JSON args from a file ('-': stdin).")
@click.option("--queue", help="Queue [the task's, else 'default'].")
@click.option("--priority", type=int, help="Lower runs first [0].")
@click.option("--run-at", help="Not before this ISO 8601 time (with offset).")
@click.option("--delay", type=DURATION, help="Not before this long from now (30s, 5m, 1h, 1d, or seconds).")
@click.option("--max-attempts", type=int, help="Attempts before the job ends failed [5].")
@click.option("--unique-key", help="At most one queued or running job per key; prints the holder's id.")
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP",
              help="module:app registering TASK (default: $SKIPLOCK_APP): its queue, priority and attempts apply, "
                   f"an unknown TASK or args its handler cannot take are refused. {APP_SEARCH}")
@click.pass_obj
@handle_errors
def enqueue(obj: Context, task: str, args_json: str, args_file: Any, queue: str | None, priority: int | None, run_at: str | None,
            delay: float | None, max_attempts: int | None, unique_key: str | None, app_spec: str | None) -> None:
    """Enqueue one job of TASK and print its id.

    Without an app (--app or SKIPLOCK_APP) the task's registered options are not applied (the job
    gets the defaults given here) and TASK is not checked: a warning says so."""
    if args_file is not None:
        args_json = args_file.read()
    args = json_option("--args", args_json)
    app = obj.app(app_spec)
    if app_spec:
        check_args_against_handler(app.get_task(task), args)  # UnknownTask -> clear error
    job_id = app.enqueue(task, args, queue=queue, priority=priority, run_at=_parse_time(run_at), delay=delay,
                         max_attempts=max_attempts, unique_key=unique_key)
    console.print(job_id, markup=False)
    if not app_spec:
        warn(f"no app given (--app or SKIPLOCK_APP): {task!r} was not checked and its registered options "
             "(queue, priority, max attempts) were not applied")


def job_document(job: Job) -> dict[str, Any]:
    """A job as ``skiplock jobs --json`` prints it: every stored field (not the live connection)."""
    return {f.name: getattr(job, f.name) for f in fields(job) if not f.name.startswith("_")}


def _job_detail(job: Job) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for field in ("id", "task", "queue", "state", "priority", "attempts", "max_attempts", "run_at", "created_at",
                  "started_at", "finished_at", "worker"):
        value = getattr(job, field)
        shown = when(value) if isinstance(value, datetime) else "" if value is None else getattr(value, "value", value)
        table.add_row(field, plain(shown))
    table.add_row("args", plain(json.dumps(job.args)))
    if job.result is not None:
        table.add_row("result", plain(json.dumps(job.result)))
    console.print(table)
    if job.last_error:
        console.print("\n[bold]last error[/]")
        console.print(job.last_error, markup=False)
    if len(job.errors) > 1:
        console.print(f"\n[bold]{len(job.errors)} errors recorded[/] (attempt: first line)")
        for e in job.errors:
            console.print(f"  {e.get('attempt')}: {str(e.get('error', '')).splitlines()[0] if e.get('error') else ''}",
                          markup=False)


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("--state", type=click.Choice([s.value for s in JobState]))
@click.option("--queue")
@click.option("--task")
@click.option("--limit", type=click.IntRange(1, 100000), default=50, show_default=True)
@click.option("--before", type=click.IntRange(1), help="Only jobs with a lower id (the next page: the last id shown).")
@json_flag
@click.pass_obj
@handle_errors
def jobs(obj: Context, job_id: int | None, state: str | None, queue: str | None, task: str | None, limit: int,
         before: int | None, as_json: bool) -> None:
    """List jobs (newest first), or show one job in full with JOB_ID. A job whose handler runs now is
    shown running, whichever its lease."""
    app = obj.app()
    if job_id is not None:
        job = app.get_job(job_id)
        if as_json:
            emit_json(job_document(job))
        else:
            _job_detail(job)
        return
    listed = app.list_jobs(state=state, queue=queue, task=task, limit=limit, before=before)
    untakeable = {(q, t) for q, t, _ in untakeable_jobs(app)} if any(j.state == JobState.QUEUED for j in listed) else set()
    flagged = {j.id for j in listed if j.state == JobState.QUEUED and (j.queue, j.task) in untakeable}
    if as_json:
        docs = []
        for j in listed:
            doc = job_document(j)
            doc["takeable"] = j.id not in flagged
            docs.append(doc)
        emit_json({"jobs": docs, "next_before": listed[-1].id if len(listed) == limit else None})
        return
    from rich.table import Table

    table = Table()
    for col in ("id", "queue", "task", "state", "pri", "attempts", "run_at", "last error"):
        table.add_column(col)
    for j in listed:
        err = (j.last_error or "").splitlines()[0][:60] if j.last_error else ""
        shown = j.state.value + ("*" if j.id in flagged else "")
        table.add_row(str(j.id), plain(j.queue), plain(j.task), f"[{STATE_STYLE[j.state.value]}]{shown}[/]",
                      str(j.priority), f"{j.attempts}/{j.max_attempts}", when(j.run_at), plain(err))
    console.print(table)
    if flagged:
        console.print("queued*: no running worker can take it (none serving its queue has its task)", soft_wrap=True)
