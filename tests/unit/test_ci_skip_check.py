"""In CI no test may be skipped, MariaDB's included (issue 12, "Tests and CI"): tests/conftest.py's
``pytest_sessionfinish`` turns any skip into a failed run when ``CI`` is set, and ``.ci/run`` sets it.

The check is exercised for real: a pytest subprocess on a scratch directory whose conftest loads the
suite's own hook, with one test skipped the way the MariaDB fixtures skip on a machine without the
server (``mariadb_server.INSTALL_HINT``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

CONFTEST = f'''
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("skiplock_suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_sessionfinish = suite.pytest_sessionfinish  # the suite's own hook, unchanged
'''

TEST = '''
import pytest
from mariadb_server import INSTALL_HINT

@pytest.fixture
def no_mariadb():
    pytest.skip(INSTALL_HINT)  # what tests/mariadb_server.py does where the server cannot be installed

def test_on_mariadb(no_mariadb):
    pass

def test_elsewhere():
    pass
'''


def run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_skipping.py").write_text(TEST)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_skipped_mariadb_test_fails_the_run_in_ci(tmp_path: Path) -> None:
    done = run(tmp_path, "1")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "CI: 1 test(s) skipped; in CI every test must run:" in done.stdout
    assert "test_skipping.py::test_on_mariadb" in done.stdout and "apt-get install -y mariadb-server" in done.stdout


def test_outside_ci_a_skip_is_only_reported(tmp_path: Path) -> None:
    done = run(tmp_path, None)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed, 1 skipped" in done.stdout


def test_ci_run_sets_ci_before_the_tests() -> None:
    """.ci/run runs the README's test command with ``CI`` set, so the check above is on there."""
    script = (REPO / ".ci" / "run").read_text()
    exported = re.search(r'^export CI="\$\{CI:-[^}]+\}"$', script, flags=re.M)
    assert exported, ".ci/run does not export CI"
    assert exported.start() < script.index(".venv/bin/pytest")
