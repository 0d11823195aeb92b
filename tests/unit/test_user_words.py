"""No internal jargon in what a user reads first (issue 13 §3): the README, every command's ``--help``
(the snapshot in cli_surface.expected, checked against the real CLI by test_cli_surface.py) and the
narration ``skiplock scenario`` prints. Words of how the project was written -- its "seed" document,
a "transcript", issue numbers -- mean nothing to a user; say what happens instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skiplock.tools.scenario import seed_steps

ROOT = Path(__file__).resolve().parents[2]
JARGON = re.compile(r"\bseed\b|\btranscripts?\b|\bissue \d+|\bDESIGN\.md\b", re.I)


def scenario_text() -> str:
    return "\n".join(part for step in seed_steps() for part in (step.description, step.before, step.note))


@pytest.mark.parametrize("name, text", [
    ("README.md", (ROOT / "README.md").read_text(encoding="utf-8")),
    ("every --help (cli_surface.expected)", (ROOT / "tests" / "unit" / "cli_surface.expected").read_text(encoding="utf-8")),
    ("skiplock scenario's narration", scenario_text()),
])
def test_no_internal_jargon(name, text):
    found = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if JARGON.search(line)]
    assert not found, f"{name}: internal words a user cannot know: {found}"
