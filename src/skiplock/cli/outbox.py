"""Outbox commands of the ``skiplock`` CLI: ``relay`` and ``outbox`` (list, show, put, redrive, prune)."""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from .formatting import when
from .group import (APP_SEARCH, Context, console, emit_json, fail, handle_errors, import_object, json_flag, json_option,
                    plain)
from .params import DURATION, Duration

if TYPE_CHECKING:
    from ..app import App

OUTBOX_STATES = ("pending", "delivering", "sent", "failed")
OUTBOX_STYLE = {"pending": "cyan", "delivering": "yellow", "sent": "green", "failed": "red"}


def load_sink(spec: str, app: App) -> Any:
    """``module:attr`` -> a sink: the object itself if it has ``deliver``, else ``attr(app)``."""
    from ..outbox.sinks import check_sink

    obj = import_object(spec, "--sink")
    if obj is None:
        fail(f"{spec!r} does not exist")
    if isinstance(obj, type) or not callable(getattr(obj, "deliver", None)):
        if not callable(obj):
            fail(f"{spec!r} is neither a sink (an object with deliver()) nor a function of the app returning one")
        obj = obj(app)
    return check_sink(obj)


def _headers(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not name.strip():
            fail(f"--header must look like 'Name: value', got {value!r}")
        out[name.strip()] = text.strip()
    return out


@click.command()
@click.option("--app", "app_spec", envvar="SKIPLOCK_APP", help=f"module:app (its DSN/schema; needed by --enqueue). {APP_SEARCH}")
@click.option("--webhook", metavar="URL", help="Deliver by HTTP POST to URL (Idempotency-Key header).")
@click.option("--enqueue", "enqueue_jobs", is_flag=True, help="Deliver by enqueueing a skiplock job per message "
              "(task = the topic, or --task), in the same transaction: exactly once.")
@click.option("--task", help="With --enqueue: the task name for every job [the message's topic].")
@click.option("--sink", "sink_spec", metavar="MODULE:ATTR", help="Your sink object, or a function of the app returning one.")
@click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'", help="With --webhook: an extra header (repeatable).")
@click.option("--timeout", type=Duration(0.01, 3600), default=10.0, show_default=True,
              help="With --webhook: how long to connect, and for each read and write (10s, 1m, or seconds).")
@click.option("--topics", help="Comma-separated topics to relay [all].")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Deliveries in flight at once.")
@click.option("--lease", type=click.Choice(["claimed", "transaction"]),
              help="claimed: short claim transaction, deliver, fenced mark (default for external sinks); "
                   "transaction: hold the row locks while delivering (always for --enqueue).")
@click.option("--lease-seconds", type=Duration(0.05, 86400), default=30.0, show_default=True,
              help="Claimed lease: how long a crashed relay's messages wait before redelivery.")
@click.option("--poll-interval", type=Duration(0.01, 60), default=0.5, show_default=True,
              help="Time between claims when nothing is available (a put's wake-up reaches the relay sooner).")
@click.option("--listen/--no-listen", default=True, show_default=True,
              help="Wake on the signal every put sends (PostgreSQL: NOTIFY; MySQL/MariaDB: a notices row the "
                   "listener polls), on one more connection; polling goes on either way.")
@click.option("--stop-when-empty", is_flag=True, help="Exit once no message is available.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True)
@click.pass_obj
@handle_errors
def relay(obj: Context, app_spec: str | None, webhook: str | None, enqueue_jobs: bool, task: str | None,
          sink_spec: str | None, headers: tuple[str, ...], timeout: float, topics: str | None, batch_size: int,
          concurrency: int, lease: str | None, lease_seconds: float, poll_interval: float, listen: bool,
          stop_when_empty: bool, log_level: str) -> None:
    """Relay outbox messages through a sink. SIGINT/SIGTERM: finish the batch in hand and exit 0."""
    from ..outbox import EnqueueJobSink, HttpSink

    chosen = [name for name, given in (("--webhook", webhook), ("--enqueue", enqueue_jobs), ("--sink", sink_spec)) if given]
    if len(chosen) != 1:
        fail("give exactly one sink: --webhook URL, --enqueue or --sink MODULE:ATTR"
             + (f" (got {', '.join(chosen)})" if chosen else ""))
    if task and not enqueue_jobs:
        fail("--task goes with --enqueue")
    if (headers or timeout != 10.0) and not webhook:
        fail("--header and --timeout go with --webhook")
    topic_list = topics.split(",") if topics else None
    if topic_list is not None and not all(topic_list):
        fail(f"--topics has an empty name: {topics!r}")
    from ..observability.logs import configure_logging

    configure_logging(log_level)  # text or --log-format json (observability/logs.py)
    app = obj.app(app_spec)
    app.check()
    if webhook:
        sink: Any = HttpSink(webhook, timeout=timeout, headers=_headers(headers))
    elif enqueue_jobs:
        sink = EnqueueJobSink(app, task)
    else:
        sink = load_sink(sink_spec or "", app)
    r = app.relay(sink, topics=topic_list, batch_size=batch_size, concurrency=concurrency, lease=lease,
                  lease_seconds=lease_seconds, poll_interval=poll_interval, listen=listen)
    log = logging.getLogger("skiplock.relay")
    log.info("relay %s delivering %s through %r (%s lease)", r.name, ", ".join(topic_list) if topic_list else "all topics",
             sink, r.lease)
    try:
        stats = r.run(stop_when_empty=stop_when_empty)
    finally:
        close = getattr(sink, "close", None)
        if callable(close):
            close()
    log.info("relay %s stopped: %d sent, %d retried, %d failed, %d lost, %d rescued", r.name, stats.sent, stats.retried,
             stats.failed, stats.lost, stats.rescued)


def _short(text: str | None, width: int = 80) -> str:
    return (text or "").splitlines()[0][:width] if text else ""


@click.group(invoke_without_command=True)
@click.option("--failed", is_flag=True, help="Only dead letters (state failed).")
@click.option("--state", type=click.Choice(OUTBOX_STATES))
@click.option("--topic")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@json_flag
@click.pass_context
@handle_errors
def outbox(ctx: click.Context, failed: bool, state: str | None, topic: str | None, limit: int, as_json: bool) -> None:
    """List outbox messages (newest first); subcommands show, put, redrive, prune."""
    if ctx.invoked_subcommand is not None:
        return
    if failed and state and state != "failed":
        fail("--failed and --state disagree")
    obj: Context = ctx.obj
    app = obj.app()
    messages = app.outbox.list_messages(state="failed" if failed else state, topic=topic, limit=limit)
    if as_json:
        emit_json({"schema": app.schema, "messages": messages})
        return
    from rich.table import Table

    table = Table(title=plain(f"skiplock outbox (schema {app.schema})"))
    for col in ("id", "topic", "key", "state", "attempts", "created", "last error"):
        table.add_column(col)
    for m in messages:
        table.add_row(str(m.id), plain(m.topic), plain(m.key or ""), f"[{OUTBOX_STYLE[m.state]}]{m.state}[/]",
                      f"{m.attempts}/{m.max_attempts}", when(m.created_at), plain(_short(m.last_error)))
    console.print(table)


@outbox.command("show")
@click.argument("message_id", type=int)
@json_flag
@click.pass_obj
@handle_errors
def outbox_show(obj: Context, message_id: int, as_json: bool) -> None:
    """One message in full, with its last error."""
    m = obj.app().outbox.get(message_id)
    if as_json:
        emit_json(m)
        return
    from rich.table import Table

    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for field in ("id", "topic", "key", "state", "attempts", "max_attempts", "idempotency_key", "created_at",
                  "available_at", "finished_at", "owner", "lease_expires_at"):
        value = getattr(m, field)
        table.add_row(field, plain(when(value) if hasattr(value, "astimezone") else "" if value is None else value))
    table.add_row("payload", plain(json.dumps(m.payload, ensure_ascii=False)))
    console.print(table)
    if m.last_error:
        console.print("\n[bold]last error[/]")
        console.print(m.last_error, markup=False)


@outbox.command("put")
@click.argument("topic")
@click.option("--payload", "payload_json", required=True, help="The message as JSON (any JSON value).")
@click.option("--key", help="Ordering key: same-key messages are delivered one at a time, in commit order.")
@click.option("--idempotency-key", help="Sent with every delivery [generated].")
@click.option("--max-attempts", type=int, help="Delivery attempts before the message ends failed [10].")
@click.pass_obj
@handle_errors
def outbox_put(obj: Context, topic: str, payload_json: str, key: str | None, idempotency_key: str | None,
               max_attempts: int | None) -> None:
    """Store one message (committed at once) and print its id and idempotency key."""
    payload = json_option("--payload", payload_json)
    ref = obj.app().outbox.put(topic, payload, key, idempotency_key=idempotency_key, max_attempts=max_attempts)
    console.print(f"{ref.id} {ref.idempotency_key}", markup=False)


@outbox.command("redrive")
@click.argument("message_ids", type=int, nargs=-1)
@click.option("--failed", "all_failed", is_flag=True, help="Every failed message (of --topic, if given).")
@click.option("--topic")
@click.pass_obj
@handle_errors
def outbox_redrive(obj: Context, message_ids: tuple[int, ...], all_failed: bool, topic: str | None) -> None:
    """Send failed messages again, with fresh attempts: MESSAGE_IDS, or --failed for all."""
    if bool(message_ids) == all_failed:
        fail("give message ids or --failed (not both)")
    if topic and not all_failed:
        fail("--topic goes with --failed")
    done = obj.app().outbox.redrive(list(message_ids) if message_ids else None, topic=topic)
    console.print(f"redrove {len(done)} message(s)" + (f": {', '.join(map(str, done))}" if done else ""), markup=False)


@outbox.command("prune")
@click.option("--older-than", type=DURATION, required=True,
              help="Delete sent messages finished longer ago than this (7d, 12h, or seconds).")
@click.pass_obj
@handle_errors
def outbox_prune(obj: Context, older_than: float) -> None:
    """Delete old sent messages (failed ones are kept until redriven)."""
    console.print(f"deleted {obj.app().outbox.prune(older_than)} sent message(s)", markup=False)
