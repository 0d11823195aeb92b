"""Django 6 (its own ``django.tasks``, which needs Python 3.12+): tests/contrib/test_django_tasks.py run
again by a Python 3.12+ interpreter, in a venv this set-up makes and caches (keyed on the interpreter
and the requirements; under ``$XDG_CACHE_HOME/skiplock-tests``), against the same real server.

The default interpreter runs the backport (Django 5.2 + django-tasks); this covers the other branch
of ``skiplock.contrib.django.compat``. No Python 3.12+ interpreter is a failure, not a skip: the test
set-up names where it looked."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ["django>=6.1,<6.2", "pytest>=8", "pytest-timeout>=2.3", "PyMySQL>=1.1,<2"]


def requirements() -> list[str]:
    """skiplock's own dependencies (pyproject.toml) and what the Django tests need, on Django 6."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + EXTRA


def candidates() -> list[str]:
    found = [shutil.which(name) for name in ("python3.12", "python3.13", "python3.14")]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found += sorted(glob.glob(os.path.join(pyenv, "versions", "3.1[2-9]*", "bin", "python3")))
    return [p for p in found if p]


def find_python() -> str | None:
    """A Python 3.12+ interpreter that runs (a pyenv shim without a selected version does not)."""
    for path in candidates():
        try:
            ok = subprocess.run([path, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return path
    return None


def django6_venv(python: str) -> Path:
    """The cached venv (made once: later runs reuse it; concurrent runs wait for the one making it)."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             check=True).stdout.strip()
    key = hashlib.sha256("\n".join([version, *requirements()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skiplock-tests"
    cache.mkdir(parents=True, exist_ok=True)
    venv = cache / f"django6-{key}"
    with open(cache / f"django6-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
            done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *requirements()],
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"installing Django 6's test venv failed:\n{done.stdout}{done.stderr}"
            (venv / "complete").write_text("\n".join(requirements()))
    return venv


def test_the_django_tests_pass_on_django_6_and_python_3_12(pg_admin_dsn):
    python = find_python()
    if python is None:
        pytest.fail("Django 6 needs Python 3.12+ and none was found (looked for python3.12/3.13/3.14 on PATH and "
                    f"in pyenv's versions: {candidates() or 'nothing'}); install one, e.g. `pyenv install 3.12`")
    venv_python = str(django6_venv(python) / "bin" / "python")
    version = subprocess.run([venv_python, "-c", "import django, sys; print(django.VERSION[0], sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("6 (3, 1"), version
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "DJANGO_", "PYTEST_"))}
    env.update(SKIPLOCK_TEST_DSN=pg_admin_dsn, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([venv_python, "-m", "pytest", "tests/contrib/test_django_tasks.py", "-q", "-p",
                           "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]
    # it ran on django.tasks, not the backport (which is not even installed there)
    check = subprocess.run([venv_python, "-c", "import importlib.util as u; print(u.find_spec('django_tasks'))"],
                           capture_output=True, text=True, env=env)
    assert check.stdout.strip() == "None"
    sys.stdout.write(done.stdout.splitlines()[-1] + "\n")
