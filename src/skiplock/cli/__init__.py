"""The ``skiplock`` command line: parsing and printing only; the work is done by the public API.

Exit codes: 0 success, 1 the operation failed (a check, a scenario step, an aborted worker),
2 bad usage or input, 3 the database is unreachable or its schema is missing or of another version.

Layout: :mod:`.group` holds the group, the global options and the shared helpers; each other module
is one family of commands and only defines them (importing it registers nothing). This module is
the one place that adds them to the group, so the full list of commands is read here:

=================  ==========================================================
``jobs``           ``enqueue``, ``jobs``
``lifecycle``      ``queues``, ``pause``, ``resume``, ``cancel``, ``retry``, ``wait``, ``prune``
``limits``         ``limits``, ``limit`` (flow control: per-queue limits, live)
``worker``         ``worker``
``status``         ``status``, ``workers`` (the read model)
``top``            ``top`` (a live view of the read model)
``outbox``         ``relay``, ``outbox`` (list, ``show``, ``put``, ``redrive``, ``prune``)
``server``         ``migrate``, ``server`` (``start``, ``stop``)
``demo``           ``scenario``, ``demo``
``dashboard``      ``dashboard`` (the web dashboard)
=================  ==========================================================

What the commands share: :mod:`.params` (the one duration syntax), :mod:`.formatting` (times,
durations, JSON documents), :mod:`.drain` (``worker --stop-when-empty``). docs/cli.md is the reference.

The console script ``skiplock`` and ``python -m skiplock`` both run :func:`main`.
"""

from __future__ import annotations

from ..errors import UnknownTask
from . import dashboard, demo, jobs, lifecycle, limits, outbox, server, status, top, worker
from .group import cli, fail

__all__ = ["cli", "main"]

for _command in (
    jobs.enqueue, jobs.jobs,
    lifecycle.queues, lifecycle.pause, lifecycle.resume, lifecycle.cancel, lifecycle.retry, lifecycle.wait,
    lifecycle.prune,
    limits.limits, limits.limit,
    worker.worker,
    status.status, status.workers, top.top,
    outbox.relay, outbox.outbox,
    server.migrate, server.server,
    demo.scenario, demo.demo,
    dashboard.dashboard,
):
    cli.add_command(_command)
del _command


def main() -> None:
    try:
        cli(standalone_mode=True)
    except UnknownTask as exc:  # pragma: no cover - handled in commands
        fail(str(exc))
