"""Show-and-check commands of the ``skiplock`` CLI: ``scenario`` (the seed transcript) and ``demo``."""

from __future__ import annotations

import sys

import click

from .group import Context, console, handle_errors


@click.command()
@click.pass_obj
@handle_errors
def scenario(obj: Context) -> None:
    """Replay the seed's two-session transcript against the server and check every step."""
    from ..tools.scenario import run_scenario

    app = obj.app()
    result = run_scenario(app.dsn, out=console)
    sys.exit(0 if result.ok else 1)


@click.command()
@click.option("--jobs", "n_jobs", type=click.IntRange(10, 1_000_000), default=10_000, show_default=True)
@click.option("--workers", type=click.IntRange(2, 32), default=4, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 64), default=2, show_default=True)
@click.pass_obj
@handle_errors
def demo(obj: Context, n_jobs: int, workers: int, concurrency: int) -> None:
    """Enqueue jobs, run worker processes, SIGKILL one mid-run, and show every effect applied exactly once."""
    from ..tools.demo import run_demo

    app = obj.app()
    ok = run_demo(app.dsn, jobs=n_jobs, workers=workers, concurrency=concurrency, console=console)
    sys.exit(0 if ok else 1)
