"""Run the Python code blocks of one Markdown file, in order, in one namespace (as a reader pasting
them into one interpreter would), and print one JSON line per block: its line, "ok", "illustrative"
(skipped: the line before its fence is ``<!-- illustrative: why -->``) or the error.

    python tests/docs/run_blocks.py README.md

Used by tests/docs/test_code_blocks.py (in a fresh interpreter per file, SKIPLOCK_DSN set)."""

from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
ILLUSTRATIVE = re.compile(r"<!--\s*illustrative\b[^>]*-->\s*$")


def blocks(text: str) -> list[tuple[int, bool, str]]:
    """(line of the fence, illustrative, code) of every ```python block."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        out.append((line, bool(ILLUSTRATIVE.search(before)), m.group(1)))
    return out


def main(path: str) -> int:
    namespace: dict = {"__name__": "__docs__"}
    failed = 0
    for line, illustrative, code in blocks(Path(path).read_text(encoding="utf-8")):
        if illustrative:
            print(json.dumps({"line": line, "result": "illustrative"}), flush=True)
            continue
        try:
            exec(compile(code, f"{path}:{line}", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - reported, the next block still runs
            failed += 1
            print(json.dumps({"line": line, "result": traceback.format_exc(limit=-3)}), flush=True)
        else:
            print(json.dumps({"line": line, "result": "ok"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
