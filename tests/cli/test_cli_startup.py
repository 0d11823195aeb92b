"""The command line starts fast because it imports only what a command needs: ``skiplock --help``
loads neither the database driver, nor the App, nor rich; ``skiplock status`` does not load the
worker, asyncio's App or the outbox relay. (What that costs in milliseconds: ``bench/cli_import.py``;
no timing is asserted here.)"""

from __future__ import annotations

import json
import subprocess
import sys

from cli_support import HERE
from support import cli_env

PROBE = """
import json, sys
from skiplock.cli import cli
try:
    cli(sys.argv[1:], prog_name="skiplock")
except SystemExit:
    pass
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=HERE, env=cli_env(HERE), capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return set(json.loads(result.stdout.rsplit("MODULES ", 1)[1]))


def test_help_imports_neither_the_driver_nor_the_app_nor_rich():
    loaded = loaded_by("--help")
    heavy = {"psycopg", "rich", "rich.console", "skiplock.app", "skiplock.worker.loop", "asyncio"} & loaded
    assert not heavy, heavy


def test_status_does_not_import_the_worker_or_the_outbox(dsn):
    loaded = loaded_by("--quiet", "--dsn", dsn, "status")
    assert "skiplock.readmodel" in loaded and "psycopg" in loaded  # it did run
    heavy = {"skiplock.worker.loop", "skiplock.worker.executor", "skiplock.aio", "skiplock.outbox.relay",
             "skiplock.maintenance.periodic"} & loaded
    assert not heavy, heavy
