"""``python -m bench.report [PATH]``: a results JSON as Markdown, for docs/benchmarks.md.

Prints the run's provenance (command, commit, machine, server) and one table row per figure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .common import REPO_ROOT


def number(v: Any, unit: str = "") -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    v = float(v)
    if abs(v) >= 100 and unit != "ms":
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:,.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    m, srv, code = meta["machine"], meta["server"], meta["git"]
    lines = [
        f"- command: `{meta['command']}`",
        f"- skiplock: `{code.get('commit')}` ({code.get('source')}"
        + (f"; modified files in src/: {len(code['src_modified_files'])}" if code.get("src_modified_files") else "")
        + ")",
        f"- worker: {meta.get('worker', {}).get('runner', 'skiplock CLI')}"
        + (f", options {meta['worker']['options']}" if meta.get("worker", {}).get("options") else ""),
        f"- machine: {m['cpu_count']} CPUs ({m.get('cpu_model')}), {m.get('memory_gb')} GB, Python {m['python']}, "
        f"psycopg {m['psycopg']}",
        f"- server: PostgreSQL {srv['server_version']} ({meta.get('server_kind')}); "
        + ", ".join(f"{k}={v}" for k, v in sorted(srv.get("settings", {}).items())),
        f"- started {meta['started_at']}, took {meta.get('duration_s', 0):.0f} s; load average "
        f"{meta['load_average_start'][0]:.1f} at the start, {meta.get('load_average_end', [0])[0]:.1f} at the end",
        "",
        "| scenario | figure | value | unit | baseline / target | ratio | goal | met |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | :---: |",
    ]
    for f in data["figures"]:
        base = f["baseline_or_target"]
        ref = f.get("reference") or ""
        base_text = "" if base is None else (f"{number(base, f['unit'])} ({ref})" if ref else number(base, f["unit"]))
        met = {True: "✅", False: "❌", None: ""}[f["target_met"]]
        lines.append(f"| {f['scenario']} | {f['name'].strip()} | {number(f['value'], f['unit'])} | {f['unit']} | "
                     f"{base_text} | {number(f['ratio'])} | {f.get('goal') or ''} | {met} |")
    if meta.get("errors"):
        lines += ["", "Failed scenarios: " + "; ".join(f"{k}: {v}" for k, v in meta["errors"].items())]
    return "\n".join(lines) + "\n"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "bench" / "results" / "latest.json"
    sys.stdout.write(markdown(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
