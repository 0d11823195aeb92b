"""Read-model commands of the ``skiplock`` CLI: ``status`` (counts, ready, failures, running now,
workers, untakeable jobs) and ``workers`` (what they show: :mod:`skiplock.readmodel`).

Each prints tables, or with ``--json`` one JSON document (:func:`status_document`,
:func:`workers_document`) whose keys are the read model's field names; a running job's object
carries its ``task``."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from ..job import JobState
from .formatting import ago, took, when
from .group import STATE_STYLE, Context, console, emit_json, fail, handle_errors, json_flag, plain

if TYPE_CHECKING:
    from ..app import App

# `skiplock status` shows this many running jobs; `skiplock jobs --state running` lists them all.
STATUS_RUNNING_ROWS = 50
# `skiplock status` shows the failures of this last stretch of time.
STATUS_FAILURES_WITHIN = timedelta(hours=24)
STATES = tuple(s.value for s in JobState)


def _none(value: object) -> str:
    return "?" if value is None else str(value)


def _table(**kwargs: Any) -> Any:
    from rich.table import Table

    return Table(**kwargs)


def counts_by_queue(app: App) -> dict[str, dict[str, int]]:
    """{queue: {state: count}} with every state present (0 when none)."""
    by_queue: dict[str, dict[str, int]] = {}
    for queue, state, n in app.counts():
        by_queue.setdefault(queue, dict.fromkeys(STATES, 0))[state] = n
    return {q: by_queue[q] for q in sorted(by_queue)}


def print_counts(app: App, by_queue: dict[str, dict[str, int]]) -> None:
    table = _table(title=plain(f"skiplock jobs (schema {app.schema})"))
    table.add_column("queue")
    for s in STATES:
        table.add_column(s, justify="right", style=STATE_STYLE[s])
    for queue, counts in by_queue.items():
        table.add_row(plain(queue), *(str(counts[s]) for s in STATES))
    if not by_queue:
        table.add_row("(no jobs)", *("0" for _ in STATES))
    console.print(table)


def print_waiting(app: App, ready: list[Any] | None = None) -> None:
    """Per queue with jobs due now (not running): how many, and how long the oldest has waited."""
    ready = app.read_model.oldest_ready() if ready is None else ready
    if not ready:
        return
    table = _table(title="Ready to run")
    for col in ("queue", "ready", "oldest waiting", "due since"):
        table.add_column(col)
    for q in ready:
        table.add_row(plain(q.queue), str(q.ready), took(q.age) + (" (paused)" if q.paused else ""),
                      when(q.oldest_run_at))
    console.print(table)


def print_failures(app: App, within: timedelta = STATUS_FAILURES_WITHIN, failures: list[Any] | None = None) -> None:
    """Jobs failed recently, by queue and error class."""
    failures = app.read_model.failures(since=within) if failures is None else failures
    if not failures:
        return
    table = _table(title=f"Failed jobs by error class (last {within.total_seconds() / 3600:g} h)")
    for col in ("queue", "error class", "failed", "last"):
        table.add_column(col)
    for f in failures:
        table.add_row(plain(f.queue), plain(f.error_class), str(f.count), when(f.last_failed_at))
    console.print(table)


def running_table(running: list[Any], title: str = "Running now") -> Any:
    table = _table(title=title)
    for col in ("job", "queue", "task", "lease", "attempt", "worker", "slot", "host", "pid", "since", "for"):
        table.add_column(col)
    for r in running:
        lease = r.lease + (" (expired)" if r.lease_expired else "")
        table.add_row(str(r.job_id), plain(r.queue), plain(r.task), lease, f"{r.attempt}/{r.max_attempts}",
                      plain(_none(r.worker)), _none(r.slot), plain(_none(r.host)), _none(r.pid), when(r.since),
                      took(r.running_for))
    return table


def print_running(app: App, limit: int = STATUS_RUNNING_ROWS) -> None:
    """The jobs in flight now (any lease) and the batches whose transaction is open."""
    from ..readmodel import all_pages

    model = app.read_model
    page = model.running_now(limit=limit)
    if not page.items:
        console.print("Nothing is running now.", soft_wrap=True)
    else:
        console.print(running_table(page.items))
        if page.cursor is not None:
            console.print(f"(the first {limit}; `skiplock jobs --state running` lists them all)", soft_wrap=True)
    _print_batches(all_pages(model.batches_in_flight))


def _print_batches(batches: list[Any]) -> None:
    if batches:
        held = sum(b.jobs for b in batches)
        console.print(f"{held} job(s) held by {len(batches)} batch(es) in flight (fast jobs sharing one transaction; "
                      "which of them runs now is not recorded)", soft_wrap=True)


def workers_table(workers: list[Any], title: str = "Workers") -> Any:
    table = _table(title=title)
    for col in ("worker", "host", "pid", "queues", "slots", "running", "started", "last seen"):
        table.add_column(col)
    for w in workers:
        queues = "(all)" if w.queues is None else ", ".join(w.queues)
        table.add_row(plain(w.name), plain(_none(w.host)), _none(w.pid), plain(queues), _none(w.concurrency),
                      str(w.running), when(w.started_at), ago(w.read_at - w.last_seen))
    return table


def print_workers(app: App, *, title: str = "Workers", say_none: bool = True, workers: list[Any] | None = None) -> None:
    """Every live worker process, as each describes itself."""
    from ..readmodel import all_pages

    workers = all_pages(app.read_model.workers) if workers is None else workers
    if not workers:
        if say_none:
            console.print("No worker is running.", soft_wrap=True)
        return
    console.print(workers_table(workers, title))


def status_document(app: App, running_limit: int = 1000) -> dict[str, Any]:
    """What ``skiplock status --json`` prints: the same as its tables, as data."""
    from ..readmodel import all_pages

    model = app.read_model
    running = model.running_now(limit=running_limit)
    workers = all_pages(model.workers)
    return {
        "schema": app.schema,
        "counts": counts_by_queue(app),
        "ready": model.oldest_ready(),
        "failures": {"since_seconds": STATUS_FAILURES_WITHIN.total_seconds(),
                     "classes": model.failures(since=STATUS_FAILURES_WITHIN)},
        "running": [running_job_document(r) for r in running],
        "running_truncated": running.cursor is not None,
        "batches_in_flight": all_pages(model.batches_in_flight),
        "workers": [worker_document(w) for w in workers],
        "untakeable": [{"queue": q, "task": t, "queued": n} for q, t, n in (app.untakeable_jobs() if workers else [])],
    }


def running_job_document(r: Any) -> dict[str, Any]:
    from dataclasses import asdict

    doc = asdict(r)
    doc.update(lease_expired=r.lease_expired, running_for=r.running_for)
    return doc


def worker_document(w: Any) -> dict[str, Any]:
    from dataclasses import asdict

    doc = asdict(w)
    doc["seen_ago"] = w.read_at - w.last_seen
    return doc


@click.command()
@json_flag
@click.option("--watch", is_flag=True, help="Keep the view live, refreshed every 2 s (as `skiplock top`).")
@click.pass_context
@handle_errors
def status(ctx: click.Context, as_json: bool, watch: bool) -> None:
    """Job counts by queue and state, the jobs running now, the live workers."""
    if watch:
        if as_json:
            fail("--watch and --json do not go together (for a live view as data, poll `status --json`)")
        root = ctx.find_root()
        group = root.command
        top = group.get_command(root, "top") if isinstance(group, click.Group) else None
        if top is None:  # by name: status and top do not import each other
            fail("the live view (`skiplock top`) is not available here")
        ctx.invoke(top)
        return
    obj: Context = ctx.obj
    app = obj.app()
    if as_json:
        emit_json(status_document(app))
        return
    print_counts(app, counts_by_queue(app))
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
    table = _table()
    for col in ("queue", "task", "queued"):
        table.add_column(col, justify="right" if col == "queued" else "left")
    for queue, task, n in untakeable:
        table.add_row(plain(queue), plain(task), str(n))  # names are data, never rich markup
    console.print(table)


@click.command()
@json_flag
@click.pass_obj
@handle_errors
def workers(obj: Context, as_json: bool) -> None:
    """Live worker processes: host, pid, queues, slots, jobs running now, started, last seen."""
    app = obj.app()
    if as_json:
        from ..readmodel import all_pages

        emit_json({"workers": [worker_document(w) for w in all_pages(app.read_model.workers)]})
        return
    print_workers(app)
