"""The ``skiplock dashboard`` command: the web dashboard (:mod:`skiplock.dashboard`) served by
uvicorn. Closed by default: the viewer token comes from ``--token-file`` or
``SKIPLOCK_DASHBOARD_TOKEN``, the operator's from ``--operator-token-file`` or
``SKIPLOCK_DASHBOARD_OPERATOR_TOKEN``; with neither, a random operator token is made and printed as a
login URL (as Jupyter does). Tokens are never taken on the command line (other local users can read
it) and never logged: uvicorn's access log, which would show a login URL, is off. ``/metrics`` is
served by default (``--no-metrics`` to leave it out), behind the same tokens."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import click

from .group import APP_SEARCH, Context, err_console, fail, handle_errors

EXTRA = "pip install 'skiplock[dashboard]'"
# Seconds between the samples of the gauges /metrics serves (as a worker's default metrics_interval).
METRICS_INTERVAL = 15.0
# On SIGTERM/SIGINT, requests still open after this many seconds (event streams) are ended.
SHUTDOWN_SECONDS = 3


def read_token(path: str, option: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped), or a one-line error."""
    try:
        mode = os.stat(path).st_mode
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {option} {path!r}: {exc.strerror if isinstance(exc, OSError) else exc}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        err_console.print(f"skiplock: warning: {option} {path!r} can be read by other users (chmod 600 it)",
                          markup=False, soft_wrap=True)
    if len(text) < 16:
        fail(f"{option} {path!r} must hold a token of at least 16 characters")
    return text


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; every address needs a token).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="File holding the read-only token [else SKIPLOCK_DASHBOARD_TOKEN].")
@click.option("--operator-token-file", type=click.Path(dir_okay=False),
              help="File holding the operator token, which may also act (retry, cancel, delete, pause, redrive) "
                   "[else SKIPLOCK_DASHBOARD_OPERATOR_TOKEN]. With no token at all, a random operator token is "
                   "made and printed as a login URL.")
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP", help=f"module:app, to show its cron schedules. {APP_SEARCH}")
@click.option("--poll", type=click.FloatRange(1, 60), default=3.0, show_default=True,
              help="Seconds between the live pages' refreshes.")
@click.option("--metrics/--no-metrics", default=True, show_default=True,
              help="Serve Prometheus metrics at /metrics, behind the dashboard's tokens (needs skiplock[metrics]; "
                   "without it, skipped with a note), the queue and outbox gauges sampled every "
                   f"{METRICS_INTERVAL:g} s.")
@click.pass_obj
@handle_errors
def dashboard(obj: Context, host: str, port: int, token_file: str | None, operator_token_file: str | None,
              app_spec: str | None, poll: float, metrics: bool) -> None:
    """Serve the web dashboard (pages, actions, audit log; see docs/dashboard.md)."""
    try:
        import uvicorn

        from ..dashboard import create_app, new_token
    except ImportError as exc:
        fail(f"the dashboard needs packages that are not installed ({exc.name}): {EXTRA}")
    viewer = (read_token(token_file, "--token-file") if token_file
              else os.environ.get("SKIPLOCK_DASHBOARD_TOKEN") or None)
    operator = (read_token(operator_token_file, "--operator-token-file") if operator_token_file
                else os.environ.get("SKIPLOCK_DASHBOARD_OPERATOR_TOKEN") or None)
    generated = viewer is None and operator is None
    if generated:
        operator = new_token()
    app = obj.app(app_spec)
    app.check()
    routes, sampler = metrics_routes(app, METRICS_INTERVAL) if metrics else ([], None)
    try:
        asgi = create_app(app, token=viewer, operator_token=operator, poll_seconds=poll, routes=routes)
    except ValueError as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    if generated:
        err_console.print(f"skiplock dashboard: log in at {url}login?token={operator}", markup=False, soft_wrap=True)
    else:
        roles = " and ".join(r for r, t in (("read-only", viewer), ("operator", operator)) if t)
        err_console.print(f"skiplock dashboard on {url} ({roles} token configured)", markup=False, soft_wrap=True)
    sys.stderr.flush()
    try:
        # a live page's event stream stays open for minutes: a stop waits for none longer than this
        uvicorn.run(asgi, host=host, port=port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=SHUTDOWN_SECONDS)
    finally:
        if sampler is not None:
            sampler.stop()


def metrics_routes(app: Any, interval: float) -> tuple[list[Any], Any]:
    """``GET /metrics`` (the App's Prometheus registry) as a route behind the dashboard's own
    authentication (any role's token or session: 401 without), and the started sampler of its queue
    and outbox gauges; none without prometheus_client (a one-line note says so)."""
    try:
        from prometheus_client.exposition import CONTENT_TYPE_LATEST
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import Response
        from starlette.routing import Route

        from ..observability.metrics import Sampler
    except ImportError:
        err_console.print("skiplock dashboard: /metrics not served (pip install 'skiplock[metrics]')",
                          markup=False, soft_wrap=True)
        return [], None
    registry = app.enable_metrics()
    sampler = Sampler(registry, interval).start()

    async def endpoint(request: Any) -> Any:
        return Response(await run_in_threadpool(registry.exposition), media_type=CONTENT_TYPE_LATEST)

    return [Route("/metrics", endpoint)], sampler
