"""The Python code blocks of the README and docs/ run as written, in order, against a real database
(a fresh one per file; SKIPLOCK_DSN names it, as a reader's environment would). A block that cannot
run on its own says so on the line before its fence -- ``<!-- illustrative: why -->`` -- and is
skipped; every other block must run without an error (tests/docs/run_blocks.py runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from run_blocks import blocks

ROOT = Path(__file__).resolve().parents[2]
FILES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
         if "```python" in p.read_text(encoding="utf-8")]


def test_every_illustrative_block_says_why():
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("<!-- illustrative"):
                assert line.startswith("<!-- illustrative: ") and len(line) > 30, f"{path.name}: {line}"
        assert blocks(text), path


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(ROOT).as_posix() for p in FILES])
def test_the_code_blocks_run_as_written(path, dsn, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["SKIPLOCK_DSN"] = dsn
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("run_blocks.py")), str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"line": ')]
    failed = [r for r in results if r["result"] not in ("ok", "illustrative")]
    assert not failed, "\n\n".join(f"{path.name}:{r['line']}\n{r['result']}" for r in failed) + proc.stderr[-2000:]
    assert len(results) == len(blocks(path.read_text(encoding="utf-8"))), proc.stdout[-2000:] + proc.stderr[-2000:]
    if path.name == "README.md":  # the Quick start's last line prints the job's state
        assert "\ndone\n" in "\n" + proc.stdout, proc.stdout
