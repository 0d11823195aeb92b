"""Show-and-check commands of the ``skiplock`` CLI: ``scenario`` (two sessions claiming jobs, step by
step) and ``demo`` (worker processes, one killed mid-run)."""

from __future__ import annotations

import sys

import click

from .group import Context, console, fail, handle_errors


@click.command()
@click.pass_obj
@handle_errors
def scenario(obj: Context) -> None:
    """Walk through two workers claiming jobs with SKIP LOCKED (two database sessions, statement by
    statement, as the README shows) and check every result."""
    from ..tools.scenario import run_scenario

    app = obj.app()
    result = run_scenario(app.dsn, out=console.real)
    sys.exit(0 if result.ok else 1)


@click.command()
@click.option("--jobs", "n_jobs", type=click.IntRange(10, 1_000_000), default=10_000, show_default=True)
@click.option("--workers", type=click.IntRange(2, 32), default=4, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 64), default=2, show_default=True)
@click.pass_obj
@handle_errors
def demo(obj: Context, n_jobs: int, workers: int, concurrency: int) -> None:
    """Enqueue jobs, run worker processes, SIGKILL one mid-run, and show every effect applied exactly once."""
    from ..tools.demo import DemoBusy, run_demo

    app = obj.app()
    try:
        ok = run_demo(app.dsn, jobs=n_jobs, workers=workers, concurrency=concurrency, console=console.real)
    except DemoBusy as exc:
        fail(str(exc), 1)
    sys.exit(0 if ok else 1)
