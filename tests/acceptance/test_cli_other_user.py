"""The test that runs the command line as another OS user (test_embedded_server.py) skips, saying
why, when that user cannot run the interpreter -- instead of failing the README's test command."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from test_embedded_server import nobody_can_run, python_for_nobody


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as the OS user 'nobody'")
def test_an_interpreter_nobody_may_not_execute_is_reported_with_the_reason():
    private = Path(tempfile.mkdtemp(prefix="skiplock-private-home-"))  # 0700, root's: as a pyenv under /root
    try:
        python = private / "python3"
        python.symlink_to(sys.executable)
        why = nobody_can_run([str(python)])
        assert why is not None and ("Permission denied" in why or "not found" in why), why
    finally:
        (private / "python3").unlink()
        private.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as the OS user 'nobody'")
def test_here_nobody_can_run_the_interpreter_so_the_other_user_test_runs():
    """CI fails on any skip: on this machine the other-user test must run, not skip."""
    assert nobody_can_run(python_for_nobody()) is None
