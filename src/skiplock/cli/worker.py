"""The ``skiplock worker`` command: run a worker until a signal (or ``--stop-when-empty``)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from .group import APP_SEARCH, Context, err_console, fail, handle_errors
from .params import Duration

if TYPE_CHECKING:
    from ..worker import Worker

# skiplock.worker.batching.DEFAULT_BATCH_SIZE, DEFAULT_BATCH_BUDGET, DEFAULT_BATCH_WAIT and FLOW_TURNS, written out so that the command
# line does not import the worker to show its help (tests/unit/test_cli_defaults.py checks they agree).
DEFAULT_BATCH_SIZE = 32
DEFAULT_BATCH_BUDGET = 0.1
DEFAULT_BATCH_WAIT = 0.016
FLOW_TURNS = 3


@click.command()
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP", required=True,
              help=f"module:app holding the tasks. {APP_SEARCH}")
@click.option("--queues", help="Comma-separated queues to serve [all].")
@click.option("--concurrency", type=click.IntRange(1, 512), default=4, show_default=True, help="Slots (connections).")
@click.option("--poll-interval", type=Duration(0.01, 60), default=0.5, show_default=True,
              help="Fallback poll when no NOTIFY arrives.")
@click.option("--batch-size", type=click.IntRange(1, 1000), default=DEFAULT_BATCH_SIZE, show_default=True,
              help="Most jobs one claim takes; fast jobs then share one commit (adaptive, see docs/batches.md).")
@click.option("--batch-budget", type=Duration(0.001, 60), default=DEFAULT_BATCH_BUDGET, show_default=True,
              help="Time after which a batch starts no further job (seconds, or 100ms).")
@click.option("--batch-slots", type=click.IntRange(1, 512), default=1, show_default=True,
              help="Slots that may run a batch at the same time.")
@click.option("--flow-batch-slots", type=click.IntRange(1, 512), default=None,
              help="Slots that may run a batch of flow-controlled jobs at the same time "
                   f"[a share of {FLOW_TURNS} per live worker process, at least 1].")
@click.option("--batch-wait", type=Duration(0, 60), default=DEFAULT_BATCH_WAIT, show_default=True,
              help="While other slots are idle, a claim takes no more jobs than start within this time "
                   "(seconds, or 16ms; 0: always the whole claim size).")
@click.option("--one-after-another", is_flag=True,
              help="Run a batch's jobs one after another on its slot (by default the jobs of a batch that are not "
                   "near-instant start together on idle slots, in its one transaction: see docs/batches.md).")
@click.option("--fixed-concurrency", is_flag=True,
              help="Let every slot hold a lease at once (by default the number adapts to how fast claims and "
                   "commits are: see docs/batches.md).")
@click.option("--stop-when-empty", is_flag=True,
              help="Exit once no job is available, after waiting for jobs due within --due-within (retries); "
                   "says what it leaves behind.")
@click.option("--due-within", type=Duration(0, 3600), default=10.0, show_default=True,
              help="With --stop-when-empty: first wait for queued jobs due this soon (0: do not wait).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True)
@click.option("--no-maintenance", is_flag=True, help="Do not run the periodic scheduler and the pruner here.")
@click.option("--fail-unknown-tasks", is_flag=True,
              help="Also claim jobs of tasks this app does not register, and fail them at once (by default they "
                   "stay queued for a worker that knows them).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs skiplock[metrics]); every request "
                   "needs 'Authorization: Bearer TOKEN', TOKEN from SKIPLOCK_METRICS_TOKEN (or "
                   "SKIPLOCK_DASHBOARD_TOKEN), else a random one written to a file this user alone can read.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics port binds.")
@click.option("--health-port", type=click.IntRange(0, 65535),
              help="Serve GET /livez (the process answers) and /readyz (the database answers, the slots run) on "
                   "this port, without a token: they show no job data (see docs/deployment.md).")
@click.option("--health-host", default="127.0.0.1", show_default=True, help="Address the health port binds.")
@click.option("--no-freeze-gc", is_flag=True,
              help="Leave Python's garbage collector as it is. By default the objects alive once the worker has "
                   "started are frozen out of its walks, which otherwise pause every slot for tens of milliseconds.")
@click.pass_obj
@handle_errors
def worker(obj: Context, app_spec: str, queues: str | None, concurrency: int, poll_interval: float,
           batch_size: int, batch_budget: float, batch_slots: int, flow_batch_slots: int | None,
           batch_wait: float, one_after_another: bool, fixed_concurrency: bool,
           stop_when_empty: bool,
           due_within: float, log_level: str, no_maintenance: bool, fail_unknown_tasks: bool,
           metrics_port: int | None, metrics_host: str, health_port: int | None, health_host: str,
           no_freeze_gc: bool) -> None:
    """Run a worker. SIGINT/SIGTERM: finish in-flight jobs and exit 0; a second signal aborts them.
    SIGUSR1: write every thread's stack to stderr, and go on."""
    from ..observability.logs import configure_logging

    configure_logging(log_level)  # text or --log-format json (observability/logs.py)
    dump_stacks_on(signal.SIGUSR1)  # every thread's stack to stderr, and on
    app = obj.app(app_spec)
    queue_list = [q for q in queues.split(",")] if queues else None
    if queue_list is not None and not all(queue_list):
        fail(f"--queues has an empty name: {queues!r}")
    app.check()

    def make_worker() -> "Worker":
        return app.worker(queues=queue_list, concurrency=concurrency, poll_interval=poll_interval,
                          batch_size=batch_size, batch_budget=batch_budget, batch_slots=batch_slots,
                          flow_batch_slots=flow_batch_slots, batch_wait=batch_wait or None,
                          side_by_side=not one_after_another,
                          maintenance=not no_maintenance, fail_unknown_tasks=fail_unknown_tasks,
                          adaptive_limit=not fixed_concurrency, freeze_gc=not no_freeze_gc)

    w = make_worker()
    log = logging.getLogger("skiplock.worker")
    log.info("worker %s serving %s with %d slot(s); tasks: %s", w.name,
             ", ".join(queue_list) if queue_list else "all queues", concurrency, ", ".join(sorted(app.tasks)) or "none")
    server = start_metrics(app, metrics_host, metrics_port) if metrics_port is not None else None
    # --stop-when-empty runs several workers one after another: readiness then asks the database only
    health = start_health(app, health_host, health_port, None if stop_when_empty else w) \
        if health_port is not None else None
    stats: Any  # a WorkerStats, or the Totals of several drains
    try:
        if stop_when_empty:
            from .drain import drain_until_quiet

            stats = drain_until_quiet(app, w, make_worker, queue_list, due_within, log)
        else:
            stats = w.run()
    finally:
        if server is not None:
            server.stop()
        if health is not None:
            health.stop()
    log.info("worker %s stopped: %d done, %d retried, %d failed", w.name, stats.done, stats.retried, stats.failed)
    sys.exit(1 if stats.aborted else 0)


def dump_stacks_on(signum: int) -> None:
    """On ``signum``, the stack of every thread goes to stderr (the worker's log) and the worker goes on:
    what a stuck worker is waiting for, without a debugger. Only this user (or root) can send it.

    A Python signal handler, run by the main thread (it joins the slots' threads a tenth of a second
    at a time) with the interpreter's lock held: every thread's frames are read while none of them
    moves (``sys._current_frames``). Not ``faulthandler``'s dump, which walks the other threads'
    frames from the signal handler while they run: in a test run one dump of a busy worker stopped
    part-way, and no later SIGUSR1 wrote anything."""
    import threading
    import traceback

    def dump(_signum: int, _frame: Any) -> None:
        names = {t.ident: t.name for t in threading.enumerate()}
        out: list[str] = []
        for ident, frame in sys._current_frames().items():
            out.append(f"Thread 0x{ident:016x} {names.get(ident, '?')!r} (most recent call first):\n")
            for entry in reversed(traceback.extract_stack(frame)):
                out.append(f'  File "{entry.filename}", line {entry.lineno} in {entry.name}\n')
            out.append("\n")
        try:
            sys.stderr.write("".join(out))
            sys.stderr.flush()
        except (OSError, ValueError, RuntimeError):  # stderr closed, or the main thread was mid-write to it
            pass  # (a reentrant write raises RuntimeError): no dump this time, and the worker goes on

    try:
        signal.signal(signum, dump)
    except (OSError, ValueError):  # not the main thread (embedded use): no dump
        pass


def start_metrics(app: Any, host: str, port: int) -> Any:
    """The worker's metrics server, or a one-line error (exit 2): no prometheus_client, a port in use."""
    try:
        from ..observability.metrics import MetricsServer, resolve_token
    except ImportError as exc:
        fail(f"--metrics-port: {exc}")
    try:
        token, token_file = resolve_token(port)
    except OSError as exc:
        fail(f"--metrics-port: cannot write a token file ({exc}); set SKIPLOCK_METRICS_TOKEN")
    try:
        server = MetricsServer(app.enable_metrics(), host, port, token).start()
    except OSError as exc:
        fail(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}")
    where = (f"the bearer token is in {token_file} (readable by this user only; set SKIPLOCK_METRICS_TOKEN to "
             "choose one)") if token_file is not None else "bearer token from the environment"
    err_console.print(f"skiplock: metrics at http://{host}:{server.port}/metrics; {where}", markup=False,
                      soft_wrap=True)
    return server


def start_health(app: Any, host: str, port: int, worker: Any) -> Any:
    """The worker's /livez and /readyz server (observability/health.py), or a one-line error (exit 2)."""
    from ..observability.health import HealthServer

    try:
        server = HealthServer(app, host, port, worker).start()
    except OSError as exc:
        fail(f"--health-port: cannot listen on {host}:{port}: {exc.strerror or exc}")
    err_console.print(f"skiplock: health at http://{host}:{server.port}/livez and /readyz", markup=False,
                      soft_wrap=True)
    return server
