"""``skiplock top``: a live terminal view of the queues, the throughput and the jobs running now.

Each refresh reads the read model once (counts, ready jobs, running jobs, workers: a handful of
read-only statements, no lock taken). Throughput is the change in finished jobs (done + failed)
between two refreshes, divided by the time between them; the first refresh has none yet.

On a terminal the view redraws in place (rich's Live); when stdout is not a terminal each refresh
is printed after the previous one. ``--iterations N`` stops after N refreshes (0: until Ctrl-C).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from .formatting import took
from .group import STATE_STYLE, Context, console, handle_errors, plain
from .params import Duration
from .status import STATES, counts_by_queue, running_table, workers_table

if TYPE_CHECKING:
    from ..app import App

RUNNING_ROWS = 20


class Sampler:
    """Reads one frame of the view and remembers the previous counts for the throughput."""

    def __init__(self, app: App):
        self.app = app
        self.previous: tuple[float, dict[str, int]] | None = None

    def frame(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        from ..readmodel import all_pages

        model = self.app.read_model
        now = time.monotonic()
        by_queue = counts_by_queue(self.app)
        ready = {q.queue: q for q in model.oldest_ready()}
        finished = {q: c["done"] + c["failed"] for q, c in by_queue.items()}
        rates: dict[str, float] | None = None
        if self.previous is not None:
            then, before = self.previous
            elapsed = max(now - then, 1e-6)
            rates = {q: max(0, n - before.get(q, 0)) / elapsed for q, n in finished.items()}
        self.previous = (now, finished)

        queues = Table(title=plain(f"skiplock top (schema {self.app.schema})"))
        queues.add_column("queue")
        for s in STATES:
            queues.add_column(s, justify="right", style=STATE_STYLE[s])
        queues.add_column("finished/s", justify="right")
        queues.add_column("oldest waiting", justify="right")
        for queue, counts in by_queue.items():
            rate = "" if rates is None else f"{rates.get(queue, 0.0):.1f}"
            age = ready[queue].age if queue in ready else None
            waiting = took(age) + (" (paused)" if queue in ready and ready[queue].paused else "")
            queues.add_row(plain(queue), *(str(counts[s]) for s in STATES), rate, waiting)
        if not by_queue:
            queues.add_row("(no jobs)", *("0" for _ in STATES), "", "")
        total = "" if rates is None else f"{sum(rates.values()):.1f} jobs/s finished"
        running = model.running_now(limit=RUNNING_ROWS)
        workers = all_pages(model.workers)
        parts: list[Any] = [queues]
        if total:
            parts.append(plain(f"throughput: {total}"))
        if running.items:
            title = "Running now" + (f" (the first {RUNNING_ROWS})" if running.cursor else "")
            parts.append(running_table(running.items, title))
        else:
            parts.append(plain("Nothing is running now."))
        parts.append(workers_table(workers) if workers else plain("No worker is running."))
        return Group(*parts)


@click.command()
@click.option("--interval", type=Duration(0.1, 3600), default=2.0, show_default=True,
              help="Time between refreshes (2s, 500ms, or seconds).")
@click.option("--iterations", type=click.IntRange(0), default=0, show_default=True,
              help="Stop after this many refreshes (0: until Ctrl-C).")
@click.pass_obj
@handle_errors
def top(obj: Context, interval: float, iterations: int) -> None:
    """A live view of the queues (counts, jobs finished per second, oldest waiting job), the jobs
    running now and the workers, refreshed every --interval."""
    app = obj.app()
    sampler = Sampler(app)
    n = 0
    if not console.is_terminal:
        while True:
            n += 1
            console.print(sampler.frame())
            if iterations and n >= iterations:
                return
            time.sleep(interval)
    from rich.live import Live

    with Live(sampler.frame(), console=console.real, auto_refresh=False, screen=False) as live:
        n = 1
        while not iterations or n < iterations:
            time.sleep(interval)
            live.update(sampler.frame(), refresh=True)
            n += 1
