"""``python -m bench.cli_import``: how long the command line takes to start, against ``python -c pass``.

    python -m bench.cli_import                 # --help, and the imports of `skiplock status`
    python -m bench.cli_import --dsn DSN       # also a real `skiplock status` against DSN
    python -m bench.cli_import --runs 20
    python -m bench.cli_import --instructions  # also each case's instruction count (valgrind), load-independent

Each case is a fresh interpreter run ``--runs`` times (after one warm-up run, so the files are in the
page cache); the figure is the fastest run (the least disturbed by other load on the machine) and the
median, both in milliseconds, and the start-up cost is that minus the same figure for
``python -c pass`` measured in the same run. The goal (issue 13) is a cost of at most 150 ms for
``skiplock --help`` and for ``skiplock status``'s imports. Prints one JSON document.

``status imports`` imports what ``skiplock status`` loads before it connects (the CLI, the App,
the read model, the PostgreSQL backend and rich, which prints its tables); ``driver alone`` is
``import psycopg, psycopg_pool`` by itself -- the part of ``status`` that skiplock does not control,
a floor under it. The real ``status`` run (``--dsn``) also connects and queries, so it measures more
than start-up.

The children run as an installed package does: with compiled bytecode (``PYTHONDONTWRITEBYTECODE``
is dropped from their environment, so the warm-up run writes the ``.pyc`` files of an editable
install; without it every run would compile skiplock's modules again, which no installed copy
does). Besides wall time, each case reports the children's CPU time (user + system), which another
process's load on the machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

GOAL_MS = 150.0

CASES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "skiplock --help": ["-m", "skiplock", "--help"],
    "status imports": ["-c", "import skiplock.cli, skiplock.app, skiplock.readmodel, skiplock.backend.postgres.backend, "
                              "rich.console, rich.table"],
    "driver alone": ["-c", "import psycopg, psycopg_pool"],
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(args: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    times, cpu = [], []
    for i in range(runs + 1):
        t0, c0 = time.perf_counter(), _children_cpu()
        subprocess.run([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL, check=True)
        if i:  # the first run only warms the page cache (and writes the bytecode)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((_children_cpu() - c0) * 1000)
    return {"fastest_ms": round(min(times), 1), "median_ms": round(statistics.median(times), 1),
            "cpu_fastest_ms": round(min(cpu), 1), "cpu_median_ms": round(statistics.median(cpu), 1)}


def instructions(args: list[str], env: dict[str, str]) -> float:
    """Millions of instructions one run executes (valgrind's callgrind: the same on a busy machine
    as on a quiet one, where wall and CPU times are not)."""
    result = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, check=True)
    match = re.search(r"Collected\s*:\s*(\d+)", result.stderr)
    if match is None:
        raise RuntimeError("valgrind printed no instruction count")
    return round(int(match.group(1)) / 1e6, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--instructions", action="store_true",
                        help="also count each case's instructions once under valgrind (apt-get install valgrind)")
    parser.add_argument("--dsn", help="also time `skiplock status` against this database (SKIPLOCK_DSN is used too)")
    opts = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONDONTWRITEBYTECODE"}
    cases = dict(CASES)
    dsn = opts.dsn or os.environ.get("SKIPLOCK_DSN")
    if dsn:
        env["SKIPLOCK_DSN"] = dsn  # in the environment, never on a command line
        cases["skiplock status (connects)"] = ["-m", "skiplock", "--quiet", "status"]
    results = {name: measure(args, opts.runs, env) for name, args in cases.items()}
    if opts.instructions:
        if shutil.which("valgrind") is None:
            parser.error("--instructions needs valgrind (apt-get install valgrind)")
        for name, args in cases.items():
            results[name]["instructions_m"] = instructions(args, env)
    base = results["python -c pass"]
    for name, r in results.items():
        if name != "python -c pass":
            r["cost_fastest_ms"] = round(r["fastest_ms"] - base["fastest_ms"], 1)
            r["cost_median_ms"] = round(r["median_ms"] - base["median_ms"], 1)
            r["cpu_cost_fastest_ms"] = round(r["cpu_fastest_ms"] - base["cpu_fastest_ms"], 1)
            if "instructions_m" in r:
                r["instructions_cost_m"] = round(r["instructions_m"] - base["instructions_m"], 1)
    goal = {name: results[name]["cost_fastest_ms"] <= GOAL_MS for name in ("skiplock --help", "status imports")}
    print(json.dumps({"python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
                      "runs": opts.runs, "goal_ms": GOAL_MS, "results": results, "goal_met": goal}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
