"""Flow-control commands of the ``skiplock`` CLI: ``limits`` (every queue's limits) and ``limit``
(set or clear a queue's concurrency and rate, live: running workers honour it at their next claim).
docs/flow-control.md; task limits are set in code (``@app.task(concurrency=, rate=)``)."""

from __future__ import annotations

import click

from .formatting import when
from .group import Context, console, emit_json, fail, handle_errors, json_flag, plain

NONE = "none"


@click.command()
@json_flag
@click.pass_obj
@handle_errors
def limits(obj: Context, as_json: bool) -> None:
    """Queues with limits: concurrency (jobs running at once), rate (starts per period), fair."""
    from rich.table import Table

    app = obj.app()
    rows = app.queue_limits()
    if as_json:
        emit_json({"schema": app.schema, "limits": rows})
        return
    table = Table(title=plain(f"skiplock limits (schema {app.schema})"))
    for column in ("queue", "concurrency", "rate", "fair", "changed"):
        table.add_column(column)
    for q in rows:
        table.add_row(plain(q["queue"]), "" if q["concurrency"] is None else str(q["concurrency"]), q["rate"] or "",
                      "fair" if q["fair"] else "", when(q["updated_at"]))
    if not rows:
        table.add_row("(no queue limits)", "", "", "", "")
    console.print(table)


@click.command()
@click.argument("queue")
@click.option("--concurrency", metavar="N|none", help="At most N jobs of QUEUE running at once, across every worker "
              "('none': no limit).")
@click.option("--rate", metavar="N/PERIOD|none", help="At most N starts per period, evenly spaced: 100/min, 5/s, "
              "1000/h, 10/30s ('none': no limit).")
@click.option("--fair/--no-fair", default=None, help="Claim round-robin across QUEUE's partitions (a partition "
              "with many jobs does not delay the others).")
@click.option("--clear", is_flag=True, help="Remove every limit of QUEUE.")
@json_flag
@click.pass_obj
@handle_errors
def limit(obj: Context, queue: str, concurrency: str | None, rate: str | None, fair: bool | None, clear: bool,
          as_json: bool) -> None:
    """Set QUEUE's limits; running workers honour them at their next claim. An option not given
    keeps its current value."""
    if clear and (concurrency is not None or rate is not None or fair is not None):
        fail("give --clear or --concurrency/--rate/--fair, not both")
    if not clear and concurrency is None and rate is None and fair is None:
        fail("nothing to change: give --concurrency N, --rate N/PERIOD, --fair or --clear (see 'skiplock limit --help')")
    number: int | None = None
    if concurrency is not None and concurrency.strip().lower() != NONE:
        try:
            number = int(concurrency)
        except ValueError:
            fail(f"--concurrency must be a whole number from 1 to 100000 or 'none', got {concurrency!r}")
    app = obj.app()
    current = {q["queue"]: q for q in app.queue_limits()}.get(queue, {"concurrency": None, "rate": None, "fair": False})
    new_concurrency = None if clear else (current["concurrency"] if concurrency is None else number)
    new_rate = None if clear or (rate is not None and rate.strip().lower() == NONE) else (rate or current["rate"])
    new_fair = False if clear else (current["fair"] if fair is None else fair)
    app.set_queue_limits(queue, concurrency=new_concurrency, rate=new_rate, fair=new_fair)
    if as_json:
        emit_json({"queue": queue, "concurrency": new_concurrency, "rate": new_rate, "fair": new_fair})
    elif new_concurrency is None and new_rate is None and not new_fair:
        console.print(f"{queue!r}: no limits", markup=False)
    else:
        parts = [f"concurrency {new_concurrency}" if new_concurrency is not None else None,
                 f"rate {new_rate}" if new_rate is not None else None, "fair" if new_fair else None]
        console.print(f"{queue!r}: " + ", ".join(p for p in parts if p), markup=False)
