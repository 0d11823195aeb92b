"""Scenario adapter: outbox relay throughput (bench/relay.py) as figures of the main run.

The reference is measured in the same run, right before each lease mode's figure: raw HTTP POSTs of the
same requests to the same local receiver on the same client with the same concurrency (what delivery
alone costs), so the ratio says what the relay adds on top.
"""

from __future__ import annotations

from .common import Context, Figure, fresh_db


def run(ctx: Context) -> list[Figure]:
    from . import relay

    messages = 1_000 if ctx.sizes.drain_jobs < 20_000 else relay.DEFAULT_MESSAGES
    with fresh_db(ctx.server, "relay") as dsn:
        ctx.log(f"relay: {messages} messages to a local HTTP receiver, both lease modes")
        r = relay.run(dsn, messages=messages)
    ctx.raw["relay"] = r
    return [
        Figure("relay", f"relay {lease} lease → local receiver", r[f"{lease}_messages_per_s"], "msg/s",
               r[f"{lease}_baseline_posts_per_s"], reference="raw HTTP POSTs just before, same requests, client, "
                                                             "receiver and concurrency",
               note="at-least-once delivery; the receiver dedups with skiplock.dedup")
        for lease in ("claimed", "transaction")
    ] + [Figure("relay", "relay → EnqueueJobSink (same database)", r["enqueue_job_messages_per_s"], "msg/s",
                r["baseline_posts_per_s"],
                reference="raw HTTP POSTs", note="no external effect: exactly once")]
