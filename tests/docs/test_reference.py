"""docs/reference.md lists every environment variable the code reads and every option of App(...),
app.task(...) and app.worker(...): adding one without documenting it fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import skiplock
from skiplock.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
SOURCES = sorted((ROOT / "src" / "skiplock").rglob("*.py"))

# an environment variable's name as the code writes it: SKIPLOCK_X anywhere (constants such as
# TOKEN_ENV and TCP_ENV hold them), or any name read through os.environ / os.getenv / click's envvar=
SKIPLOCK_NAME = re.compile(r"(?<![A-Za-z0-9_])SKIPLOCK_[A-Z][A-Z0-9_]*")
READ = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|envvar=)\s*["']([A-Z][A-Z0-9_]*)["']""")


def env_vars_in_code() -> set[str]:
    names: set[str] = set()
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        names.update(SKIPLOCK_NAME.findall(text))
        names.update(READ.findall(text))
    return names


def documented(name: str) -> bool:
    return f"`{name}`" in REFERENCE


def test_every_environment_variable_the_code_reads_is_documented():
    names = env_vars_in_code()
    assert {"SKIPLOCK_DSN", "SKIPLOCK_APP", "SKIPLOCK_METRICS_TOKEN"} <= names  # the scan finds them
    missing = sorted(n for n in names if not documented(n))
    assert not missing, f"docs/reference.md does not list: {missing}"


def options(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def test_every_option_of_app_task_and_worker_is_documented():
    for where, fn in (("App", skiplock.App.__init__), ("app.task", skiplock.App.task), ("app.worker", Worker.__init__)):
        names = [n for n in options(fn) if n != "app"]
        missing = [n for n in names if not documented(n)]
        assert not missing, f"docs/reference.md does not list {where} options {missing}"
