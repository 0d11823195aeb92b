"""Lifecycle commands of the ``skiplock`` CLI: queues, pause/resume, cancel, retry, wait, prune."""

from __future__ import annotations

import json
import sys

import click

from ..errors import DuplicateJob
from ..job import JobState
from .group import STATE_STYLE, Context, console, emit_json, err_console, fail, handle_errors, json_flag, plain
from .params import DURATION, Duration, parse_duration  # noqa: F401 - parse_duration: kept importable here


@click.command()
@json_flag
@click.pass_obj
@handle_errors
def queues(obj: Context, as_json: bool) -> None:
    """Queues with their job counts and whether they are paused."""
    from rich.table import Table

    app = obj.app()
    states = [s.value for s in JobState]
    rows = app.queues()
    if as_json:
        emit_json({"schema": app.schema, "queues": [{"queue": q["queue"], "paused": q["paused"],
                                                     "counts": {s: q["counts"].get(s, 0) for s in states},
                                                     "limits": q["limits"]}
                                                    for q in rows],
                   "task_limits": app.task_limits()})
        return
    table = Table(title=plain(f"skiplock queues (schema {app.schema})"))
    table.add_column("queue")
    table.add_column("paused")
    for s in states:
        table.add_column(s, justify="right", style=STATE_STYLE[s])
    table.add_column("limits")
    for q in rows:
        table.add_row(plain(q["queue"]), "[bold yellow]paused[/]" if q["paused"] else "", *(str(q["counts"].get(s, 0)) for s in states),
                      plain(_limits_text(q["limits"])))
    if not rows:
        table.add_row("(no queues)", "", *("0" for _ in states), "")
    console.print(table)
    tasks = app.task_limits()
    if tasks:
        console.print("task limits set at runtime: " + "; ".join(
            f"{t['task']}: {_limits_text(t) or 'none'}" for t in tasks), markup=False, soft_wrap=True)


def _limits_text(limits: dict | None) -> str:  # type: ignore[type-arg]
    """A queue's limits in the queues table: "concurrency 5, 100/min" (empty: none)."""
    if not limits:
        return ""
    parts = [f"concurrency {limits['concurrency']}" if limits["concurrency"] is not None else "", limits["rate"] or "",
             _fair_text(limits)]
    return ", ".join(p for p in parts if p)


def _fair_text(limits: dict) -> str:  # type: ignore[type-arg]
    """"fair", with its weights: "fair (a=3, b=2)"."""
    if not limits.get("fair"):
        return ""
    weights = limits.get("weights") or {}
    return "fair" + (" (" + ", ".join(f"{p}={w}" for p, w in sorted(weights.items())) + ")" if weights else "")


@click.command()
@click.argument("queue")
@click.option("--force", is_flag=True, help="Pause a queue no job has used yet.")
@click.pass_obj
@handle_errors
def pause(obj: Context, queue: str, force: bool) -> None:
    """Stop workers claiming from QUEUE (running workers honour it at once)."""
    obj.app().pause_queue(queue, force=force)
    console.print(f"paused {queue!r}", markup=False)


@click.command()
@click.argument("queue")
@click.pass_obj
@handle_errors
def resume(obj: Context, queue: str) -> None:
    """Let workers claim from QUEUE again."""
    if obj.app().resume_queue(queue):
        console.print(f"resumed {queue!r}", markup=False)
    else:
        console.print(f"{queue!r} was not paused", markup=False)


@click.command()
@click.argument("job_id", type=int)
@click.option("--reason", default="cancelled from the command line", show_default=True)
@click.option("--wait", "wait_seconds", type=Duration(0, 3600), default=10, show_default=True,
              help="How long to wait for a running job to let go.")
@click.pass_obj
@handle_errors
def cancel(obj: Context, job_id: int, reason: str, wait_seconds: float) -> None:
    """Cancel a job: a queued one never runs; a running one is rolled back and ends cancelled."""
    state = obj.app().cancel_job(job_id, reason=reason, wait=wait_seconds)
    if state == JobState.CANCELLED:
        console.print(f"job {job_id} cancelled", markup=False)
    elif state in (JobState.DONE, JobState.FAILED):
        console.print(f"job {job_id} had already finished: {state}", markup=False)
    else:
        console.print(f"job {job_id} is still {state}; it ends cancelled as soon as its handler lets go", markup=False)


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("--failed", "all_failed", is_flag=True, help="Every failed job (of --queue).")
@click.option("--queue", help="With --failed: only this queue.")
@click.pass_obj
@handle_errors
def retry(obj: Context, job_id: int | None, all_failed: bool, queue: str | None) -> None:
    """Put a failed (or cancelled) job back in the queue, or every failed job with --failed.

    A job whose unique key a queued or running job holds cannot be retried: one line each says so,
    and the exit code is 1 (the others are retried)."""
    if (job_id is None) == (not all_failed):
        fail("give a JOB_ID or --failed (not both)")
    if queue is not None and not all_failed:
        fail("--queue goes with --failed")
    app = obj.app()
    if job_id is not None:
        try:
            app.retry_job(job_id)
        except DuplicateJob as exc:
            fail(str(exc), 1)
        console.print(f"job {job_id} queued again", markup=False)
    else:
        ids = app.retry_failed(queue)
        console.print(f"{len(ids)} failed job(s) queued again", markup=False)
        for why in ids.not_retried.values():
            err_console.print(f"error: {why}", markup=False, soft_wrap=True)
        if ids.not_retried:
            sys.exit(1)


@click.command()
@click.argument("job_id", type=int)
@click.option("--timeout", type=DURATION, help="Give up after this long (30s, 5m, or seconds; exit 1).")
@click.pass_obj
@handle_errors
def wait(obj: Context, job_id: int, timeout: float | None) -> None:
    """Wait for a job to finish and print its result as JSON (exit 1 if it failed or timed out)."""
    from ..errors import JobFailed, WaitTimeout

    try:
        result = obj.app().wait(job_id, timeout=timeout)
    except (JobFailed, WaitTimeout) as exc:
        fail(str(exc), 1)
    console.print(json.dumps(result), markup=False)


@click.command()
@click.option("--done", "done_age", type=DURATION, help="Keep done jobs this long [1d].")
@click.option("--failed", "failed_age", type=DURATION, help="Keep failed jobs this long [30d].")
@click.option("--cancelled", "cancelled_age", type=DURATION, help="Keep cancelled jobs this long [7d].")
@click.pass_obj
@handle_errors
def prune(obj: Context, done_age: float | None, failed_age: float | None, cancelled_age: float | None) -> None:
    """Delete finished jobs past their retention, in small batches that never lock the queue."""
    app = obj.app()
    retention = dict(app.retention)
    for state, value in (("done", done_age), ("failed", failed_age), ("cancelled", cancelled_age)):
        if value is not None:
            retention[state] = value
    deleted = app.prune(retention)
    if not deleted:
        console.print("another process is pruning; nothing done", markup=False)
    else:
        console.print("deleted " + ", ".join(f"{n} {s}" for s, n in deleted.items()), markup=False)
