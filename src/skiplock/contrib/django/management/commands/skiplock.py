"""``manage.py skiplock ...``: skiplock's command line (docs/cli.md) on the project's settings.

Every command and option is the ``skiplock`` CLI's; the DSN comes from ``DATABASES[DATABASE]`` (given
through the environment of this process, never on a command line), the schema from ``SCHEMA``, the
App (``--app``) is the project's, with every installed app's ``tasks`` module imported, and
``worker`` serves the backend's ``QUEUES`` unless ``--queues`` is given. ``manage.py skiplock worker
--stop-when-empty``, ``manage.py skiplock migrate``, ``manage.py skiplock status``, ``manage.py
skiplock dashboard``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "skiplock's command line on this project's settings: worker, migrate, status, dashboard, jobs, ..."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("skiplock_args", nargs=argparse.REMAINDER, help="a skiplock command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        # everything after "skiplock" is the skiplock CLI's (its --help included), except Django's
        # --settings/--pythonpath, which manage.py has already applied
        args, rest = [], list(argv[2:])
        while rest:
            arg = rest.pop(0)
            if arg in ("--settings", "--pythonpath"):
                rest[:1] = []
            elif not arg.startswith(("--settings=", "--pythonpath=")):
                args.append(arg)
        self._called_from_command_line = True
        self.execute(skiplock_args=args, verbosity=1, no_color=False, force_color=False, skip_checks=True,
                     traceback=False)

    def handle(self, *args: Any, skiplock_args: list[str] | None = None, **options: Any) -> None:
        from skiplock.cli import cli
        from skiplock.contrib.django.connection import dsn_of
        from skiplock.contrib.django.runtime import options as settings_options

        opts = settings_options()
        argv = list(skiplock_args or []) + list(args)
        if argv[:1] == ["worker"] and opts["QUEUES"] and not any(a.split("=", 1)[0] == "--queues" for a in argv):
            argv += ["--queues", ",".join(opts["QUEUES"])]
        env = {"SKIPLOCK_DSN": dsn_of(opts["DATABASE"]), "SKIPLOCK_SCHEMA": opts["SCHEMA"],
               "SKIPLOCK_APP": "skiplock.contrib.django.runtime:cli_app"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            cli.main(args=argv, prog_name="manage.py skiplock")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
