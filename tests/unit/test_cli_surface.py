"""The command line's surface is a contract: every command, option, envvar, default, help text and
the exit code of ``--help`` stay as they are unless changed on purpose.

``cli_surface.expected`` holds ``skiplock --help`` and every (sub)command's ``--help`` output, then
click's structural description of every command (options, envvars, types, defaults, required), as
the command line produced them when this test was written. A deliberate change to the command line
regenerates it (``python tests/unit/test_cli_surface.py --write``) and the diff shows the change in
review; an unintended one (a lost option, a changed help line or envvar) fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import click
from click.testing import CliRunner

from skiplock.cli import cli, main

EXPECTED = Path(__file__).with_name("cli_surface.expected")
# click's test runner wraps help at 80 columns wherever the test runs; a real terminal of 82 columns
# wraps it the same (click leaves 2 columns free). The group's own limit (max_content_width, 100) is
# recorded with the structure.
COLUMNS = "82"


def _command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            paths.extend(_command_paths(command.commands[name], (*path, name)))
    return paths


def _env() -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SKIPLOCK_")}
    env["COLUMNS"] = COLUMNS
    return env


def _help(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, prog_name="skiplock", env=_env(), catch_exceptions=False)
    return result.exit_code, result.output


def _structure() -> str:
    with click.Context(cli, info_name="skiplock") as ctx:
        info = cli.to_info_dict(ctx)
    info["context_settings"] = cli.context_settings
    return json.dumps(info, indent=1, sort_keys=True, default=repr)


def surface() -> str:
    """The whole surface as one text: each command's help, then the structure."""
    parts = []
    for path in _command_paths(cli):
        code, output = _help([*path, "--help"])
        parts.append(f"=== skiplock {' '.join((*path, '--help'))} (exit {code})\n{output}")
    parts.append(f"=== structure\n{_structure()}\n")
    return "\n".join(parts)


def _first_difference(expected: str, actual: str) -> str:
    for n, (e, a) in enumerate(zip(expected.splitlines(), actual.splitlines()), 1):
        if e != a:
            return f"line {n}:\n  expected: {e!r}\n  actual:   {a!r}"
    return f"lengths differ: expected {len(expected.splitlines())} lines, got {len(actual.splitlines())}"


def test_every_command_option_envvar_and_help_text_is_as_recorded():
    expected = EXPECTED.read_text(encoding="utf-8")
    actual = surface()
    assert actual == expected, (
        f"the CLI surface changed ({_first_difference(expected, actual)}); if on purpose, regenerate "
        f"{EXPECTED.name} with `python tests/unit/test_cli_surface.py --write`")


def test_short_help_option_prints_the_same_help():
    assert _help(["-h"]) == _help(["--help"])
    assert _help(["server", "start", "-h"]) == _help(["server", "start", "--help"])


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["COLUMNS"] = COLUMNS
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_python_dash_m_skiplock_prints_the_recorded_help():
    proc = _run([sys.executable, "-m", "skiplock", "--help"])
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == _help(["--help"])[1].replace("Usage: skiplock", "Usage: python -m skiplock", 1)


def test_the_installed_skiplock_script_prints_the_recorded_help():
    script = Path(sys.executable).with_name("skiplock")  # installed with the package (pip install -e .)
    proc = _run([str(script), "outbox", "put", "--help"])
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == _help(["outbox", "put", "--help"])[1]


def test_the_console_script_is_skiplock_cli_main():
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "skiplock"]
    assert script.value == "skiplock.cli:main"
    assert script.load() is main


if __name__ == "__main__":  # pragma: no cover - regenerates the expected file on purpose
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (records the current CLI surface as the contract)")
    os.environ.update({k: v for k, v in _env().items() if v is not None})
    EXPECTED.write_text(surface(), encoding="utf-8")
    print(f"wrote {EXPECTED}")
