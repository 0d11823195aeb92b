"""Fixtures of the security tests: throw-away embedded servers in fresh data directories, and an
intruder -- another OS user on the same machine -- to attack them with."""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from security_support import Servers


@pytest.fixture(scope="session")
def intruder() -> Iterator[str]:
    """A throw-away OS user that is neither the test runner nor the server's user (created, removed)."""
    if os.geteuid() != 0:
        pytest.skip("attacking as another OS user needs root (to create that user)")
    name = f"skintr{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)  # a leftover of a killed run
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    pwd.getpwnam(name)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def servers() -> Iterator[Servers]:
    """Makes data directories (short or long paths) and stops/removes every server at the end."""
    s = Servers(Path(tempfile.mkdtemp(prefix="skl-")))
    try:
        yield s
    finally:
        s.cleanup()
