"""Helpers for the command-line tests: the real ``skiplock`` CLI run as a subprocess (cwd: this
directory, so ``--app cli_tasks:app`` imports), and the one-line error check every bad input meets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import cli_env

HERE = Path(__file__).resolve().parent


def run(dsn: str | None, *args: str, env: dict[str, str] | None = None, quiet: bool = True,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m skiplock [--quiet] [--dsn DSN] ARGS`` (the timeout is only a safety net)."""
    argv = [sys.executable, "-m", "skiplock", *(["--quiet"] if quiet else []), *(["--dsn", dsn] if dsn else []), *args]
    extra = dict(env or {})
    full = cli_env(HERE)
    if "PYTHONPATH" in extra:  # in front of this directory's (and the outer PYTHONPATH)
        extra["PYTHONPATH"] = os.pathsep.join([extra["PYTHONPATH"], full["PYTHONPATH"]])
    full.update(extra)
    return subprocess.run(argv, cwd=HERE, env=full, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def one_json_document(result: subprocess.CompletedProcess[str]) -> Any:
    """stdout is exactly one JSON document (json.loads refuses anything after it)."""
    ok(result)
    return json.loads(result.stdout)


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """Exit ``code``, no traceback, exactly one line on stderr, starting ``error: ``."""
    assert result.returncode == code, f"exit {result.returncode}, wanted {code}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]
