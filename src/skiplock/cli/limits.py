"""Flow-control commands of the ``skiplock`` CLI: ``limits`` (every queue's limits, and the task limits
set at runtime) and ``limit`` (set or clear a queue's concurrency, rate, fairness and partition
weights -- or, with ``--task``, a task's concurrency and rate over its code's -- live: running workers
honour it within a second). docs/flow-control.md."""

from __future__ import annotations

from typing import Any

import click

from .formatting import when
from .group import Context, console, emit_json, fail, handle_errors, json_flag, plain
from .lifecycle import _fair_text, _limits_text

NONE = "none"


@click.command()
@json_flag
@click.pass_obj
@handle_errors
def limits(obj: Context, as_json: bool) -> None:
    """Queues with limits: concurrency (jobs running at once), rate (starts per period), fair (with
    partition weights); and tasks whose limits were set at runtime (``skiplock limit --task``)."""
    from rich.table import Table

    app = obj.app()
    rows = app.queue_limits()
    tasks = app.task_limits()
    clearing = app.clearing_queue_limits()
    if as_json:
        emit_json({"schema": app.schema, "limits": rows, "task_limits": tasks, "clearing": clearing})
        return
    table = Table(title=plain(f"skiplock limits (schema {app.schema})"))
    for column in ("queue", "concurrency", "rate", "fair", "changed"):
        table.add_column(column)
    for q in rows:
        table.add_row(plain(q["queue"]), "" if q["concurrency"] is None else str(q["concurrency"]), q["rate"] or "",
                      plain(_fair_text(q)), when(q["updated_at"]))
    if not rows:
        table.add_row("(no queue limits)", "", "", "", "")
    console.print(table)
    for queue in clearing:
        console.print(plain(f"queue {queue}: limits cleared; the workers' flow claim serves it until its "
                            "jobs in flight since then end (every worker's maintenance pass then hands it back "
                            "to the plain claims)"))
    if tasks:
        table = Table(title="task limits set at runtime (over the code's)")
        for column in ("task", "concurrency", "rate", "changed"):
            table.add_column(column)
        for t in tasks:
            table.add_row(plain(t["task"]), "" if t["concurrency"] is None else str(t["concurrency"]), t["rate"] or "",
                          when(t["updated_at"]))
        console.print(table)


def _number(concurrency: str | None) -> int | None:
    if concurrency is None or concurrency.strip().lower() == NONE:
        return None
    try:
        return int(concurrency)
    except ValueError:
        fail(f"--concurrency must be a whole number from 1 to 100000 or 'none', got {concurrency!r}")


def _weights(given: tuple[str, ...], current: dict[str, int]) -> dict[str, int]:
    """``--weight PARTITION=N`` (repeatable; N=1 or 'none' drops the partition's weight) over ``current``."""
    out = dict(current)
    for item in given:
        partition, sep, value = item.rpartition("=")
        if not sep or not partition:
            fail(f"--weight must look like PARTITION=N (e.g. customer:42=3), got {item!r}")
        if value.strip().lower() in (NONE, "1"):
            out.pop(partition, None)
            continue
        try:
            out[partition] = int(value)
        except ValueError:
            fail(f"--weight {item!r}: the weight must be a whole number from 1 to 1000 or 'none'")
    return out


@click.command()
@click.argument("queue", required=False)
@click.option("--task", "task", metavar="NAME", help="Set the limits of task NAME instead of a queue's: they replace "
              "the ones in its code in every running worker (--clear: back to the code's).")
@click.option("--concurrency", metavar="N|none", help="At most N jobs running at once, across every worker "
              "('none': no limit).")
@click.option("--rate", metavar="N/PERIOD|none", help="At most N starts per period, evenly spaced: 100/min, 5/s, "
              "1000/h, 10/30s ('none': no limit).")
@click.option("--fair/--no-fair", default=None, help="Claim round-robin across QUEUE's partitions (a partition "
              "with many jobs does not delay the others).")
@click.option("--weight", "weights", multiple=True, metavar="PARTITION=N", help="In a fair QUEUE, PARTITION gets N "
              "times the claims of a partition of weight 1 (the default; N=1 or 'none' resets it). Repeatable.")
@click.option("--clear", is_flag=True, help="Remove every limit of QUEUE (of the task: back to its code's).")
@json_flag
@click.pass_obj
@handle_errors
def limit(obj: Context, queue: str | None, task: str | None, concurrency: str | None, rate: str | None,
          fair: bool | None, weights: tuple[str, ...], clear: bool, as_json: bool) -> None:
    """Set QUEUE's limits (or, with --task, a task's); running workers honour them within a second.
    An option not given keeps its current value."""
    if (queue is None) == (task is None):
        fail("give a QUEUE or --task NAME (one of them)")
    if clear and (concurrency is not None or rate is not None or fair is not None or weights):
        fail("give --clear or --concurrency/--rate/--fair/--weight, not both")
    if task is not None:
        _task_limit(obj, task, concurrency, rate, fair, weights, clear, as_json)
        return
    assert queue is not None
    if not clear and concurrency is None and rate is None and fair is None and not weights:
        fail("nothing to change: give --concurrency N, --rate N/PERIOD, --fair, --weight or --clear "
             "(see 'skiplock limit --help')")
    number = _number(concurrency)
    app = obj.app()
    current: dict[str, Any] = {q["queue"]: q for q in app.queue_limits()}.get(
        queue, {"concurrency": None, "rate": None, "fair": False, "weights": {}})
    new_concurrency = None if clear else (current["concurrency"] if concurrency is None else number)
    new_rate = None if clear or (rate is not None and rate.strip().lower() == NONE) else (rate or current["rate"])
    new_fair = False if clear else (current["fair"] if fair is None else fair)
    new_weights = {} if clear or not new_fair else _weights(weights, current["weights"])
    if weights and not new_fair:
        fail("--weight applies to a fair queue: give --fair with it")
    app.set_queue_limits(queue, concurrency=new_concurrency, rate=new_rate, fair=new_fair, weights=new_weights)
    if as_json:
        emit_json({"queue": queue, "concurrency": new_concurrency, "rate": new_rate, "fair": new_fair,
                   "weights": new_weights})
    elif new_concurrency is None and new_rate is None and not new_fair:
        console.print(f"{queue!r}: no limits", markup=False)
    else:
        text = _limits_text({"concurrency": new_concurrency, "rate": new_rate, "fair": new_fair, "weights": new_weights})
        console.print(f"{queue!r}: {text}", markup=False)


def _task_limit(obj: Context, task: str, concurrency: str | None, rate: str | None, fair: bool | None,
                weights: tuple[str, ...], clear: bool, as_json: bool) -> None:
    if fair is not None or weights:
        fail("--fair and --weight are a queue's (a task's limits are --concurrency and --rate)")
    if not clear and concurrency is None and rate is None:
        fail("nothing to change: give --concurrency N, --rate N/PERIOD or --clear (see 'skiplock limit --help')")
    number = _number(concurrency)
    app = obj.app()
    current: dict[str, Any] = {t["task"]: t for t in app.task_limits()}.get(task, {"concurrency": None, "rate": None})
    new_concurrency = None if clear else (current["concurrency"] if concurrency is None else number)
    new_rate = None if clear or (rate is not None and rate.strip().lower() == NONE) else (rate or current["rate"])
    app.set_task_limits(task, concurrency=new_concurrency, rate=new_rate, clear=clear)
    if as_json:
        emit_json({"task": task, "concurrency": new_concurrency, "rate": new_rate, "cleared": clear})
    elif clear:
        console.print(f"task {task!r}: the limits in its code", markup=False)
    else:
        text = _limits_text({"concurrency": new_concurrency, "rate": new_rate}) or "no limits (over its code's)"
        console.print(f"task {task!r}: {text}", markup=False)
