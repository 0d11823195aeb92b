"""The package type-checks (mypy, configured in pyproject.toml): every statement that always returns a
row goes through ``row_of``, every Optional is handled."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_issues_in_the_package():
    with tempfile.TemporaryDirectory(prefix="skiplock-mypy-") as cache:
        result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache, "src/skiplock"], cwd=ROOT,
                                capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
