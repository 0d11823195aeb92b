"""``python -m bench``: the pgbench baseline and every scenario in one run; a table, and JSON.

    python -m bench                      # fresh embedded PostgreSQL in a temporary directory, full run
    python -m bench --quick              # smoke run (under a minute)
    python -m bench --only drain,latency # some scenarios (their references are added automatically)
    python -m bench --dsn postgresql://… # an existing server (we CREATE/DROP a database per scenario)
    python -m bench --rev HEAD           # the committed skiplock of a git revision, not the working tree
    python -m bench --only outage --outages 5,17   # outage recovery without the 60 s outage
    python -m bench --only sweep         # slots 4..256 and processes 1..8 for 0/1/10 ms jobs (opt-in)
    python -m bench --only load          # pickup latency of 1 ms jobs offered at 50 % of capacity
    python -m bench --only dashboard     # p95 of every dashboard page with 1,000,000 jobs (opt-in)
    python -m bench --only flow          # flow control's claims as a ratio to the unlimited drain
    python -m bench.soak                 # the 30-minute soak (its own command; --quick: 3 minutes)
    python -m bench --only mariadb       # MariaDB: drain, 8x8, enqueue vs mariadb-slap (bench/mariadb.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from .common import (FULL, QUICK, REPO_ROOT, Context, Figure, MachineLoad, Server, from_dsn, git, start_embedded,
                     use_revision)

# Scenario modules import skiplock, so they are loaded only after --rev has chosen which one.
SCENARIOS = ["baseline", "drain", "many_workers", "backlog", "enqueue", "latency", "load", "outbox_relay", "outage",
             "sweep", "dashboard", "flow", "aio"]
# Run only when asked for (--only): the slot/process sweep takes several minutes on its own; the
# dashboard's loads 1,000,000 jobs (about a minute) and measures pages, not the queue; flow: flow
# control's claims (bench/flow.py); aio: the asyncio worker (bench/aio.py).
OPT_IN = {"sweep", "dashboard", "flow", "aio"}
# what each scenario's ratios are measured against
NEEDS = {"drain": ["baseline"], "many_workers": ["baseline", "drain"], "backlog": ["baseline"], "flow": ["drain"]}

console = Console(highlight=False)
if not console.is_terminal:
    console = Console(highlight=False, width=220)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", help="an existing PostgreSQL server (a database per scenario is created on it)")
    p.add_argument("--data-dir", help="embedded server data directory to use and leave running "
                                      "[default: a fresh one in a temporary directory, deleted at the end]")
    p.add_argument("--only", help=f"comma-separated scenarios: {', '.join(SCENARIOS)}; or 'mariadb' alone "
                                  "(a private MariaDB, its own baseline: bench/mariadb.py)")
    p.add_argument("--quick", action="store_true", help="a short smoke run with small sizes")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "latest.json"), help="JSON output path")
    p.add_argument("--drain-concurrency", default="8",
                   help="slots of the 1-process drain; a comma list measures each [8]")
    p.add_argument("--latency-concurrency", type=int, default=4, help="slots of the latency worker [4, the default]")
    p.add_argument("--worker-option", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for app.worker() in every worker process, value as JSON (e.g. batch_size=10, "
                        "listen=false, queues='[\"default\"]'); repeatable. Workers then run through bench.worker "
                        "instead of the skiplock CLI")
    p.add_argument("--rev", help="benchmark skiplock's src/ as committed in this git revision (exported with "
                                 "git archive to a temporary directory) instead of the working tree")
    p.add_argument("--outages", help="outage scenario: comma-separated seconds the server stays down "
                                     "[5,17,60; --quick: 2,5]")
    p.add_argument("--sweep-rounds", type=int, help="sweep: run every cell this many times, interleaved, and report "
                   "medians [3; 1 with --quick]")
    p.add_argument("--no-end-baseline", action="store_true",
                   help="do not repeat the pgbench baseline at the end (done by default in full runs)")
    return p.parse_args(argv)


def selected(only: str | None) -> list[str]:
    if not only:
        return [s for s in SCENARIOS if s not in OPT_IN]
    wanted = [s.strip().replace("-", "_") for s in only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    for s in list(wanted):
        for dep in NEEDS.get(s, []):
            if dep not in wanted:
                console.print(f"[dim]adding {dep}: {s} is measured against it[/]")
                wanted.append(dep)
    return [s for s in SCENARIOS if s in wanted]


def git_info() -> dict[str, Any]:
    try:
        dirty = git("status", "--porcelain", "--", "src")
        return {"commit": git("rev-parse", "HEAD"), "describe": git("describe", "--always", "--dirty"),
                "source": "working tree", "src_modified_files": dirty.splitlines()}
    except (OSError, subprocess.SubprocessError, SystemExit):
        return {"commit": None, "source": "working tree"}


def machine_info() -> dict[str, Any]:
    import psutil
    import psycopg

    import skiplock

    return {"cpu_count": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
            "cpu_model": _cpu_model(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "psycopg": psycopg.__version__, "skiplock": skiplock.__version__}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, int) or (abs(v) >= 100 and unit not in ("ms",)):
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:,.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def print_table(figures: list[Figure], meta: dict[str, Any]) -> None:
    t = Table(title=f"skiplock benchmarks — {meta['machine']['cpu_count']} CPUs, PostgreSQL "
                    f"{meta['server']['server_version']}, {meta['git'].get('describe')}"
                    f"{' (quick)' if meta['quick'] else ''}")
    for col, justify in (("scenario", "left"), ("figure", "left"), ("value", "right"), ("unit", "left"),
                         ("baseline / target", "right"), ("ratio", "right"), ("goal", "left"), ("met", "center")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for f in figures:
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: ""}[f.target_met]
        ratio = f.ratio
        t.add_row(f.scenario, f.name, fmt(f.value, f.unit), f.unit,
                  (f"{fmt(f.baseline_or_target, f.unit)} ({f.reference})" if f.reference else fmt(f.baseline_or_target))
                  if f.baseline_or_target is not None else "",
                  "" if ratio is None else f"{ratio:.3g}", "" if f.goal is None else
                  (f"{f.goal}" if f.goal_on == "value" else f"ratio {f.goal}"), met)
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only and args.only.strip() == "mariadb":  # its own private server and baseline (bench/mariadb.py)
        from . import mariadb

        default_out = str(REPO_ROOT / "bench" / "results" / "latest.json")
        return mariadb.run(args.quick, None if args.out == default_out else Path(args.out))
    names = selected(args.only)
    code = use_revision(args.rev) if args.rev else git_info()
    import importlib

    import skiplock

    runners: dict[str, Callable[[Context], list[Figure]]] = {
        name: importlib.import_module(f".{name}", __package__).run for name in SCENARIOS}
    from . import baseline
    from .worker import parse_option

    try:
        options = dict(parse_option(o) for o in args.worker_option)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"--worker-option: {exc}") from None
    sizes = QUICK if args.quick else FULL
    if args.outages:
        try:
            outages = tuple(float(x) for x in args.outages.split(",") if x.strip())
        except ValueError:
            raise SystemExit(f"--outages: expected comma-separated seconds, got {args.outages!r}") from None
        if not outages or min(outages) <= 0:
            raise SystemExit(f"--outages: expected positive seconds, got {args.outages!r}")
        sizes = dataclasses.replace(sizes, outage_seconds=outages)
    if args.sweep_rounds is not None:
        if args.sweep_rounds < 1:
            raise SystemExit(f"--sweep-rounds: expected a positive count, got {args.sweep_rounds}")
        sizes = dataclasses.replace(sizes, sweep_rounds=args.sweep_rounds)
    drain_conc = [int(x) for x in args.drain_concurrency.split(",") if x.strip()]
    started = time.time()
    t0 = time.perf_counter()
    console.print(f"[bold]skiplock bench[/]: {', '.join(names)}{' (quick)' if args.quick else ''}")
    from .sweep import MAX_CONNECTIONS

    server: Server = from_dsn(args.dsn) if args.dsn else start_embedded(
        args.data_dir, MAX_CONNECTIONS if "sweep" in names else None)
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    durations: dict[str, float] = {}
    ctx = Context(server=server, sizes=sizes, drain_concurrency=drain_conc, latency_concurrency=args.latency_concurrency,
                  worker_options=options,
                  log=lambda msg: console.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/] {msg}"))
    try:
        meta: dict[str, Any] = {
            "command": " ".join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]),
            "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
            "quick": args.quick, "sizes": sizes.__dict__, "scenarios": names,
            "machine": machine_info(), "server": server.version(), "git": code,
            "skiplock_imported_from": str(Path(skiplock.__file__).parent),
            "server_kind": "external (--dsn)" if args.dsn else "embedded",
            "worker": {"runner": "bench.worker" if options else "skiplock CLI", "options": options,
                       "drain_concurrency": drain_conc, "latency_concurrency": args.latency_concurrency},
            "load_average_start": os.getloadavg(),
        }
        ctx.log(f"PostgreSQL {meta['server']['server_version']} at {args.dsn and 'the given DSN' or server.embedded_data_dir}"
                f"; server CPU accounting {'on' if ctx.cpu().proc else 'unavailable (not a local server)'}")
        load = MachineLoad(ctx.cpu())
        plan = list(names)
        if "baseline" in names and not args.quick and not args.no_end_baseline and len(names) > 1:
            plan.append("baseline_end")
        for name in plan:
            s = time.perf_counter()
            try:
                if name == "baseline_end":
                    figures += baseline.run(ctx, label="baseline_end")
                else:
                    figures += runners[name](ctx)
            except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others' figures
                errors[name] = f"{type(exc).__name__}: {exc}"
                console.print(f"[red]{name} failed:[/] {type(exc).__name__}: {exc}")
            durations[name] = time.perf_counter() - s
        runs = [r["baseline.claim_tps"] for r in ctx.raw.get("baseline_runs", [])]
        if len(runs) > 1:
            figures.append(Figure("baseline", "pgbench TPS drift, end run / start run", runs[-1] / runs[0], "×",
                                  note="how much the machine's capacity moved during the run"))
        other = load.other_cores()
        figures.append(Figure("machine", "CPU used by other processes during the run", other, "cores",
                              note=f"of {os.cpu_count()}: other people's work on this machine; the more, the noisier"))
        for f in figures:
            f.resolve(ctx.refs)
        meta.update(duration_s=time.perf_counter() - t0, scenario_durations_s=durations,
                    load_average_end=os.getloadavg(), errors=errors)
    finally:
        server.close()
        if code.get("export_dir"):
            shutil.rmtree(code.pop("export_dir"), ignore_errors=True)
    out = {"meta": meta, "figures": [f.to_json() for f in figures], "references": ctx.refs, "raw": ctx.raw}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print_table(figures, meta)
    goals = [f for f in figures if f.target_met is not None]
    console.print(f"{sum(1 for f in goals if f.target_met)}/{len(goals)} targets met; "
                  f"{meta['duration_s']:.0f} s; JSON: {path}")
    if errors:
        console.print(f"[red]failed scenarios: {', '.join(errors)}[/]")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
