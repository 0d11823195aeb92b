"""Fixtures for the command-line tests (on top of tests/conftest.py's real PostgreSQL databases)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from cli_support import HERE
from support import cli_env


@pytest.fixture
def holding_worker(dsn: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real ``skiplock worker`` process (1 slot) and the file that releases its ``hold`` jobs."""
    release = tmp_path / "release"
    argv = [sys.executable, "-m", "skiplock", "--quiet", "worker", "--app", "cli_tasks:app", "--concurrency", "1",
            "--poll-interval", "0.05", "--no-maintenance", "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, cwd=HERE, env=cli_env(HERE, SKIPLOCK_DSN=dsn), stdin=subprocess.DEVNULL)
    try:
        yield proc, release
    finally:
        release.touch()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
