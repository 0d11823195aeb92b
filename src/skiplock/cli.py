"""The ``skiplock`` command line: parsing and printing only; the work is done by the public API.

Exit codes: 0 success, 1 the operation failed (a check, a scenario step, an aborted worker),
2 bad usage or input, 3 the database is unreachable or its schema is missing or of another version.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
from datetime import datetime
from typing import Any, Callable, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .app import App
from .errors import DatabaseUnavailable, SchemaError, SkiplockError, UnknownTask
from .job import Job, JobState
from .worker.loop import DEFAULT_BATCH_SIZE

err_console = Console(stderr=True, highlight=False)
console = Console(highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    sys.exit(code)


def plain(value: object) -> Text:
    """Data (a schema, queue or task name, an error, JSON) for a rich table: shown as it is, never
    read as markup (a name like ``[/bold]`` would otherwise break the output)."""
    return Text(str(value))


class Context:
    def __init__(self, dsn: str | None, data_dir: str | None, schema: str | None, quiet: bool):
        self.dsn, self.data_dir, self.schema, self.quiet = dsn, data_dir, schema, quiet

    def app(self, spec: str | None = None) -> App:
        """The user's App (``module:attr``) or a plain one, configured from the global options."""
        app = load_app(spec) if spec else App()
        app.configure(dsn=self.dsn, data_dir=self.data_dir, schema=self.schema)
        self.announce(app)
        return app

    def announce(self, app: App) -> None:
        _ = app.dsn  # resolves the DSN, starting the embedded server if needed
        server = app.embedded_server
        if server is not None and not self.quiet:
            tcp = f", TCP 127.0.0.1:{server.port}" if server.tcp else ""
            err_console.print(f"skiplock: embedded PostgreSQL in {server.data_dir} (socket {server.socket_dir}, "
                              f"port {server.port}{tcp})", markup=False, soft_wrap=True)


def search_current_directory_for(module_name: str) -> None:
    """Make ``module_name`` importable from the current directory when nothing on ``sys.path`` has
    it. The directory goes *last* on the path, so it only ever adds names: a file there
    (``json.py``, ``click.py``) never shadows a standard or installed module, for the ``--app``
    module's own imports or for anything imported later."""
    top = module_name.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    cwd = os.getcwd()
    if not found and cwd not in sys.path:
        sys.path.append(cwd)


def import_object(spec: str, option: str) -> Any:
    """``package.module:attr`` (attr may be dotted) -> the object, or a clear error naming ``option``.
    A module found nowhere else is looked for in the current directory (after every other entry of
    ``sys.path``: :func:`search_current_directory_for`)."""
    if ":" not in spec:
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    module_name, attr = spec.split(":", 1)
    if not all(part.isidentifier() for part in module_name.split(".")):
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    search_current_directory_for(module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import {module_name!r} for {option}: {exc}")
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    return obj


APP_SEARCH = ("The module is imported from the installed packages and PYTHONPATH; if none has it, from the "
              "current directory, searched last (it never shadows an installed module).")


def load_app(spec: str) -> App:
    obj = import_object(spec, "--app")
    if not isinstance(obj, App):
        fail(f"{spec!r} is not a skiplock.App (found {type(obj).__name__})")
    return obj


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User mistakes and unreachable databases become one clear line, not a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (DatabaseUnavailable, SchemaError) as exc:
            fail(str(exc), 3)
        except SkiplockError as exc:
            fail(str(exc), 2)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--dsn", envvar="SKIPLOCK_DSN",
              help="PostgreSQL DSN. Default: the embedded server. A DSN with a password is better given as "
                   "SKIPLOCK_DSN: other local users can read a command line. Never shown with its password.")
@click.option("--data-dir", envvar="SKIPLOCK_DATA_DIR", type=click.Path(file_okay=False),
              help="Embedded server data directory (when no DSN is given).")
@click.option("--schema", envvar="SKIPLOCK_SCHEMA", help="Database schema holding skiplock's tables [skiplock].")
@click.option("-q", "--quiet", is_flag=True, help="Do not announce the embedded server.")
@click.version_option(package_name="skiplock")
@click.pass_context
def cli(ctx: click.Context, dsn: str | None, data_dir: str | None, schema: str | None, quiet: bool) -> None:
    """skiplock: a PostgreSQL job queue on FOR UPDATE SKIP LOCKED; the transaction is the lease."""
    ctx.obj = Context(dsn, data_dir, schema, quiet)



def json_option(option: str, text: str) -> Any:
    """The value of a JSON command-line option, or a clear one-line error (exit 2)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not valid JSON: {exc}")
    except RecursionError:
        fail(f"{option} is nested too deeply")

@cli.command()
@click.pass_obj
@handle_errors
def migrate(obj: Context) -> None:
    """Install or upgrade the schema (safe to run twice or concurrently)."""
    app = obj.app()
    applied = app.migrate()
    if applied:
        console.print(f"applied migration(s) {', '.join(map(str, applied))} to schema {app.schema!r}", markup=False)
    else:
        console.print(f"schema {app.schema!r} is up to date", markup=False)


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


@cli.command()
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


@cli.command()
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP", required=True,
              help=f"module:app holding the tasks. {APP_SEARCH}")
@click.option("--queues", help="Comma-separated queues to serve [all].")
@click.option("--concurrency", type=click.IntRange(1, 512), default=4, show_default=True, help="Slots (connections).")
@click.option("--poll-interval", type=click.FloatRange(0.01, 60), default=0.5, show_default=True,
              help="Fallback poll when no NOTIFY arrives.")
@click.option("--batch-size", type=click.IntRange(1, 1000), default=DEFAULT_BATCH_SIZE, show_default=True,
              help="Most jobs one claim takes; fast jobs then share one commit (adaptive, see docs/batches.md).")
@click.option("--batch-budget", type=click.FloatRange(0.001, 60), default=0.05, show_default=True,
              help="Seconds after which a batch starts no further job.")
@click.option("--batch-slots", type=click.IntRange(1, 512), default=1, show_default=True,
              help="Slots that may run a batch at the same time.")
@click.option("--fixed-concurrency", is_flag=True,
              help="Let every slot hold a lease at once (by default the number adapts to how fast claims and "
                   "commits are: see docs/batches.md).")
@click.option("--stop-when-empty", is_flag=True, help="Exit once no job is available.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True)
@click.option("--no-maintenance", is_flag=True, help="Do not run the periodic scheduler and the pruner here.")
@click.option("--fail-unknown-tasks", is_flag=True,
              help="Also claim jobs of tasks this app does not register, and fail them at once (by default they "
                   "stay queued for a worker that knows them).")
@click.pass_obj
@handle_errors
def worker(obj: Context, app_spec: str, queues: str | None, concurrency: int, poll_interval: float,
           batch_size: int, batch_budget: float, batch_slots: int, fixed_concurrency: bool, stop_when_empty: bool,
           log_level: str, no_maintenance: bool, fail_unknown_tasks: bool) -> None:
    """Run a worker. SIGINT/SIGTERM: finish in-flight jobs and exit 0; a second signal aborts them."""
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = obj.app(app_spec)
    queue_list = [q for q in queues.split(",")] if queues else None
    if queue_list is not None and not all(queue_list):
        fail(f"--queues has an empty name: {queues!r}")
    app.check()
    w = app.worker(queues=queue_list, concurrency=concurrency, poll_interval=poll_interval,
                   batch_size=batch_size, batch_budget=batch_budget, batch_slots=batch_slots,
                   maintenance=not no_maintenance, fail_unknown_tasks=fail_unknown_tasks,
                   adaptive_limit=not fixed_concurrency)
    logging.getLogger("skiplock.worker").info(
        "worker %s serving %s with %d slot(s); tasks: %s", w.name, ", ".join(queue_list) if queue_list else "all queues",
        concurrency, ", ".join(sorted(app.tasks)) or "none")
    stats = w.run(stop_when_empty=stop_when_empty)
    logging.getLogger("skiplock.worker").info("worker %s stopped: %d done, %d retried, %d failed", w.name, stats.done,
                                              stats.retried, stats.failed)
    sys.exit(1 if stats.aborted else 0)


STATE_STYLE = {"queued": "cyan", "running": "yellow", "done": "green", "failed": "red", "cancelled": "magenta"}


@cli.command()
@click.pass_obj
@handle_errors
def status(obj: Context) -> None:
    """Job counts by queue and state, the jobs running now, the live workers."""
    from .cli_readmodel import print_failures, print_running, print_waiting, print_workers

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


def _untakeable(app: App) -> list[tuple[str, str, int]]:
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


@cli.command()
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
    untakeable = {(q, t) for q, t, _ in _untakeable(app)} if any(j.state == JobState.QUEUED for j in listed) else set()
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


@cli.command()
@click.pass_obj
@handle_errors
def scenario(obj: Context) -> None:
    """Replay the seed's two-session transcript against the server and check every step."""
    from .scenario import run_scenario

    app = obj.app()
    result = run_scenario(app.dsn, out=console)
    sys.exit(0 if result.ok else 1)


@cli.command()
@click.option("--jobs", "n_jobs", type=click.IntRange(10, 1_000_000), default=10_000, show_default=True)
@click.option("--workers", type=click.IntRange(2, 32), default=4, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 64), default=2, show_default=True)
@click.pass_obj
@handle_errors
def demo(obj: Context, n_jobs: int, workers: int, concurrency: int) -> None:
    """Enqueue jobs, run worker processes, SIGKILL one mid-run, and show every effect applied exactly once."""
    from .demo import run_demo

    app = obj.app()
    ok = run_demo(app.dsn, jobs=n_jobs, workers=workers, concurrency=concurrency, console=console)
    sys.exit(0 if ok else 1)


@cli.group()
def server() -> None:
    """The embedded PostgreSQL server."""


@server.command("start")
@click.option("--tcp/--no-tcp", default=None,
              help="Also listen on 127.0.0.1 (password still required), or stop doing so; kept for later starts. "
                   "[default: as before; a new server: Unix socket only]")
@click.pass_obj
@handle_errors
def server_start(obj: Context, tcp: bool | None) -> None:
    """Start (or reuse) the embedded server and print its DSN (and its TCP DSN with --tcp).

    Only its owner can use it: the DSN names a password file only the owner can read."""
    from .embedded import ensure_server

    s = ensure_server(obj.data_dir, tcp=tcp)
    console.print(s.dsn, markup=False, soft_wrap=True)
    if s.tcp:
        console.print(s.tcp_dsn, markup=False, soft_wrap=True)


@server.command("stop")
@click.pass_obj
@handle_errors
def server_stop(obj: Context) -> None:
    """Stop the embedded server."""
    from .embedded import stop_server

    console.print("stopped" if stop_server(obj.data_dir) else "not running", markup=False)


from . import cli_lifecycle  # noqa: E402,F401 - registers its commands on `cli`
from . import cli_outbox  # noqa: E402,F401 - registers `relay` and `outbox` on `cli`
from . import cli_readmodel  # noqa: E402,F401 - registers `workers` on `cli`


def main() -> None:
    try:
        cli(standalone_mode=True)
    except UnknownTask as exc:  # pragma: no cover - handled in commands
        fail(str(exc))


if __name__ == "__main__":
    main()
