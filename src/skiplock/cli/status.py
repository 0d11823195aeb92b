"""Read-model commands of the ``skiplock`` CLI: ``status`` (counts, ready, failures, running now,
workers, untakeable jobs) and ``workers`` (what they show: :mod:`skiplock.readmodel`)."""

from __future__ import annotations

from datetime import datetime, timedelta

import click
from rich.table import Table
from rich.text import Text

from ..app import App
from ..job import JobState
from ..readmodel import all_pages
from .group import STATE_STYLE, Context, console, handle_errors, plain

# `skiplock status` shows this many running jobs; `skiplock jobs --state running` lists them all.
STATUS_RUNNING_ROWS = 50
# `skiplock status` shows the failures of this last stretch of time.
STATUS_FAILURES_WITHIN = timedelta(hours=24)


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


def _took(value: timedelta | None) -> str:
    if value is None:
        return ""
    seconds = max(0.0, value.total_seconds())
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _none(value: object) -> str:
    return "?" if value is None else str(value)


def print_waiting(app: App) -> None:
    """Per queue with jobs due now (not running): how many, and how long the oldest has waited."""
    ready = app.read_model.oldest_ready()
    if not ready:
        return
    table = Table(title="Ready to run")
    for col in ("queue", "ready", "oldest waiting", "since"):
        table.add_column(col)
    for q in ready:
        table.add_row(plain(q.queue), str(q.ready), _took(q.age) + (" (paused)" if q.paused else ""),
                      _when(q.oldest_run_at))
    console.print(table)


def print_failures(app: App, within: timedelta = STATUS_FAILURES_WITHIN) -> None:
    """Jobs failed recently, by queue and error class."""
    failures = app.read_model.failures(since=within)
    if not failures:
        return
    table = Table(title=f"Failed jobs by error class (last {within.total_seconds() / 3600:g} h)")
    for col in ("queue", "error class", "failed", "last"):
        table.add_column(col)
    for f in failures:
        table.add_row(plain(f.queue), plain(f.error_class), str(f.count), _when(f.last_failed_at))
    console.print(table)


def print_running(app: App, limit: int = STATUS_RUNNING_ROWS) -> None:
    """The jobs in flight now (any lease) and the batches whose transaction is open."""
    model = app.read_model
    page = model.running_now(limit=limit)
    if not page.items:
        console.print("Nothing is running now.", soft_wrap=True)
    else:
        table = Table(title="Running now")
        for col in ("job", "queue", "task", "lease", "attempt", "worker", "slot", "host", "pid", "since", "for"):
            table.add_column(col)
        for r in page:
            lease = r.lease + (" (expired)" if r.lease_expired else "")
            table.add_row(str(r.job_id), plain(r.queue), plain(r.task), lease, f"{r.attempt}/{r.max_attempts}",
                          plain(_none(r.worker)), _none(r.slot), plain(_none(r.host)), _none(r.pid), _when(r.since),
                          _took(r.running_for))
        console.print(table)
        if page.cursor is not None:
            console.print(f"(the first {limit}; `skiplock jobs --state running` lists them all)", soft_wrap=True)
    batches = all_pages(model.batches_in_flight)
    if batches:
        held = sum(b.jobs for b in batches)
        console.print(f"{held} job(s) held by {len(batches)} batch(es) in flight (fast jobs sharing one transaction; "
                      "which of them runs now is not recorded)", soft_wrap=True)


def print_workers(app: App, *, title: str = "Workers", say_none: bool = True) -> None:
    """Every live worker process, as each describes itself."""
    workers = all_pages(app.read_model.workers)
    if not workers:
        if say_none:
            console.print("No worker is running.", soft_wrap=True)
        return
    table = Table(title=title)
    for col in ("worker", "host", "pid", "queues", "slots", "running", "started", "last seen"):
        table.add_column(col)
    for w in workers:
        queues = "(all)" if w.queues is None else ", ".join(w.queues)
        table.add_row(plain(w.name), plain(_none(w.host)), _none(w.pid), plain(queues), _none(w.concurrency),
                      str(w.running), _when(w.started_at), f"{_took(w.read_at - w.last_seen)} ago")
    console.print(table)


@click.command()
@click.pass_obj
@handle_errors
def status(obj: Context) -> None:
    """Job counts by queue and state, the jobs running now, the live workers."""
    app = obj.app()
    counts = app.counts()
    states = [s.value for s in JobState]
    table = Table(title=plain(f"skiplock jobs (schema {app.schema})"))
    table.add_column("queue")
    for s in states:
        table.add_column(s, justify="right", style=STATE_STYLE[s])
    by_queue: dict[str, dict[str, int]] = {}
    for queue, state, n in counts:
        by_queue.setdefault(queue, {})[state] = n
    for queue in sorted(by_queue):
        table.add_row(plain(queue), *(str(by_queue[queue].get(s, 0)) for s in states))
    if not by_queue:
        table.add_row("(no jobs)", *("0" for _ in states))
    console.print(table)
    print_waiting(app)
    print_failures(app)
    print_running(app)
    print_workers(app, say_none=False)
    _print_untakeable(app)


def untakeable_jobs(app: App) -> list[tuple[str, str, int]]:
    """Queued jobs (queue, task, count) that no running worker can take, while some worker runs (when
    none runs, every queued job waits for one: ``skiplock status`` says so once)."""
    return app.untakeable_jobs() if app.live_workers() else []


def _print_untakeable(app: App) -> None:
    """Queued jobs that no running worker can take (no live worker serving the queue registers the task)."""
    untakeable = app.untakeable_jobs()
    if not untakeable:
        return
    if not app.live_workers():
        console.print("No worker is running: queued jobs wait for one.", soft_wrap=True)
        return
    console.print("Queued jobs no running worker can take (none serving the queue has the task):", soft_wrap=True)
    table = Table()
    for col in ("queue", "task", "queued"):
        table.add_column(col, justify="right" if col == "queued" else "left")
    for queue, task, n in untakeable:
        table.add_row(Text(queue), Text(task), str(n))  # names are data, never rich markup
    console.print(table)


@click.command()
@click.pass_obj
@handle_errors
def workers(obj: Context) -> None:
    """Live worker processes: host, pid, queues, slots, jobs running now, started, last seen."""
    print_workers(obj.app())
