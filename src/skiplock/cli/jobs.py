"""Job commands of the ``skiplock`` CLI: ``enqueue`` and ``jobs`` (the list, or one job in full)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from ..job import Job, JobState
from .group import APP_SEARCH, STATE_STYLE, Context, console, fail, handle_errors, json_option, plain
from .status import untakeable_jobs


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


@click.command()
@click.argument("task")
@click.option("--args", "args_json", default="{}", show_default=True, help="Keyword arguments as a JSON object.")
@click.option("--args-file", type=click.File("r", encoding="utf-8"), help="Read the JSON args from a file ('-': stdin).")
@click.option("--queue", help="Queue [the task's, else 'default'].")
@click.option("--priority", type=int, help="Lower runs first [0].")
@click.option("--run-at", help="Not before this ISO 8601 time (with offset).")
@click.option("--delay", type=float, help="Not before this many seconds from now.")
@click.option("--max-attempts", type=int, help="Attempts before the job ends failed [5].")
@click.option("--unique-key", help="At most one queued or running job per key; prints the holder's id.")
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP",
              help=f"module:app, to check TASK is registered. {APP_SEARCH}")
@click.pass_obj
@handle_errors
def enqueue(obj: Context, task: str, args_json: str, args_file: Any, queue: str | None, priority: int | None, run_at: str | None,
            delay: float | None, max_attempts: int | None, unique_key: str | None, app_spec: str | None) -> None:
    """Enqueue one job of TASK and print its id."""
    if args_file is not None:
        args_json = args_file.read()
    args = json_option("--args", args_json)
    app = obj.app(app_spec)
    if app_spec:
        app.get_task(task)  # UnknownTask -> clear error
    job_id = app.enqueue(task, args, queue=queue, priority=priority, run_at=_parse_time(run_at), delay=delay,
                         max_attempts=max_attempts, unique_key=unique_key)
    console.print(job_id, markup=False)


def _job_detail(job: Job) -> None:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for field in ("id", "task", "queue", "state", "priority", "attempts", "max_attempts", "run_at", "created_at",
                  "started_at", "finished_at", "worker"):
        table.add_row(field, plain(getattr(job, field)))
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
@click.pass_obj
@handle_errors
def jobs(obj: Context, job_id: int | None, state: str | None, queue: str | None, task: str | None, limit: int,
         before: int | None) -> None:
    """List jobs (newest first), or show one job in full with JOB_ID. A transaction-lease job whose
    handler runs now is shown running."""
    app = obj.app()
    if job_id is not None:
        _job_detail(app.get_job(job_id))
        return
    table = Table()
    for col in ("id", "queue", "task", "state", "pri", "attempts", "run_at", "last error"):
        table.add_column(col)
    listed = app.list_jobs(state=state, queue=queue, task=task, limit=limit, before=before)
    untakeable = {(q, t) for q, t, _ in untakeable_jobs(app)} if any(j.state == JobState.QUEUED for j in listed) else set()
    flagged = {j.id for j in listed if j.state == JobState.QUEUED and (j.queue, j.task) in untakeable}
    for j in listed:
        err = (j.last_error or "").splitlines()[0][:60] if j.last_error else ""
        shown = j.state.value + ("*" if j.id in flagged else "")
        table.add_row(str(j.id), plain(j.queue), plain(j.task), f"[{STATE_STYLE[j.state.value]}]{shown}[/]",
                      str(j.priority), f"{j.attempts}/{j.max_attempts}",
                      j.run_at.isoformat(timespec="seconds") if j.run_at else "", plain(err))
    console.print(table)
    if flagged:
        console.print("queued*: no running worker can take it (none serving its queue has its task)", soft_wrap=True)
