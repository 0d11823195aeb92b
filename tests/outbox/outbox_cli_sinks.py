"""Sinks the CLI tests load with ``skiplock relay --sink outbox_cli_sinks:ATTR``."""

from __future__ import annotations

import os

from skiplock.outbox import HttpSink


def webhook_from_env(app):
    """A factory: called with the app, returns the sink."""
    return HttpSink(os.environ["TEST_WEBHOOK"], timeout=60)


not_a_sink = 42
