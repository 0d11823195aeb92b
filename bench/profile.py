"""``python -m bench.profile``: where a drain's time goes, for docs/benchmarks.md.

1. Statements per job: a small drain in a database with ``log_statement = 'all'``; the server log's
   statements are counted by session kind (lease connection, bookkeeping connection). Every
   statement is one client/server round trip here (psycopg sends each on its own, BEGIN included).
2. Python hot spots: the same drain as the benchmark, with the worker process under py-spy
   (``pip install py-spy`` into the environment; it is not a dependency of skiplock): once with
   idle samples (``--idle``), which shows where the slots' wall time goes (per deepest skiplock
   frame, and how much of it is waiting for the server), and once sampling only the thread holding
   the GIL (``--gil``), which shows what burns the worker's Python CPU.

Needs a server this process can read the log of: the embedded one (the default starts a fresh one).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .common import REPO_ROOT, dbname_of, fresh_db, settle, spawn_worker, start_embedded, use_revision


def statement_counts(server_dsn: str, log_path: Path, dsn: str, jobs: int, concurrency: int,
                     options: dict[str, Any]) -> dict[str, float]:
    from .drain import enqueue_noops

    db = dbname_of(dsn)
    enqueue_noops(dsn, jobs)
    with psycopg.connect(server_dsn, autocommit=True) as c:
        c.execute(sql.SQL("ALTER DATABASE {} SET log_statement = 'all'").format(sql.Identifier(db)))
        # the application name tells lease connections from bookkeeping ones (reset afterwards)
        c.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %a@%d '")
        c.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    offset = log_path.stat().st_size
    try:
        spawn_worker(dsn, concurrency, options=options).wait(300)
        settle(dsn)
        time.sleep(0.5)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute("ALTER SYSTEM RESET log_line_prefix")
            c.execute("SELECT pg_reload_conf()")
    with log_path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    pattern = re.compile(r"\] (skiplock[^@]*)@" + re.escape(db) + r" LOG:  (?:statement|execute [^:]*): (\w+)")
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for m in pattern.finditer(text):
        kind = "lease" if m.group(1).startswith("skiplock-worker") else m.group(1)
        counts[(kind, m.group(2).upper())] += 1
    return {f"{kind}: {stmt}": n / jobs for (kind, stmt), n in sorted(counts.items())}


def _frames(raw: str) -> list[tuple[list[str], int]]:
    """py-spy raw lines as ([frame, ...] root first, samples); frames as 'Function (path/file.py)'."""
    out = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            out.append((frames, int(count)))
    return out


def slot_phases(raw: str) -> list[tuple[str, float, float]]:
    """Where the worker slots' wall time goes: per deepest skiplock frame, its share of all slot
    samples and the part of that share spent waiting for the server (inside psycopg's wait)."""
    phases: collections.Counter[str] = collections.Counter()
    waiting: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, k in _frames(raw):
        if not any(f.startswith("Worker._slot ") for f in frames):
            continue
        total += k
        deepest = max((i for i, f in enumerate(frames) if "skiplock/" in f), default=0)
        below = frames[deepest + 1:]
        name = frames[deepest].split(" (")[0]
        if below and not below[0].startswith(("Connection.execute", "Cursor.execute")):
            name += " → " + below[0].split(" (")[0]
        if not below:
            name += " [own code / lock wait]"
        elif below[-1].startswith(("Condition.wait", "Event.wait", "Lock.acquire")) or "threading.py" in below[-1]:
            name += " [sleeping]"
        phases[name] += k
        if any(f.startswith("Connection.wait ") for f in below):
            waiting[name] += k
    return [(name, n / total, waiting[name] / total) for name, n in phases.most_common(25)]


def cpu_functions(raw: str, n: int = 20) -> tuple[float, list[tuple[str, float]], list[tuple[str, float]]]:
    """(share of GIL samples in worker slots, inclusive shares, self shares) per function, over the
    slot threads' samples only (imports and start-up left out)."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = slots = 0
    for frames, k in _frames(raw):
        total += k
        if not any(f.startswith("Worker._slot ") for f in frames):
            continue
        slots += k
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    skip = ("Thread.", "Worker._slot ")
    return (slots / max(total, 1),
            [(f, c / slots) for f, c in incl.most_common(n + 4) if not f.startswith(skip)][:n],
            [(f, c / slots) for f, c in own.most_common(n)])


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--data-dir", help="embedded server data directory [a fresh temporary one]")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "profile"))
    p.add_argument("--rev", help="profile src/ as committed in this git revision instead of the working tree")
    p.add_argument("--worker-option", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for app.worker(), as for python -m bench")
    args = p.parse_args()
    export = None
    if args.rev:
        code = use_revision(args.rev)
        export = code["export_dir"]
        print(f"skiplock from {code['describe']}")
    from .drain import enqueue_noops
    from .worker import parse_option

    options = dict(parse_option(o) for o in args.worker_option)

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = start_embedded(args.data_dir)
    try:
        log_path = server.embedded_data_dir / "server.log"  # type: ignore[operator]
        with fresh_db(server, "profile_statements") as dsn:
            counts = statement_counts(server.dsn, log_path, dsn, 500, args.concurrency, options)
        print("statements per job (each a round trip):")
        for k, v in counts.items():
            print(f"  {v:6.3f}  {k}")
        if not Path(py_spy).exists():
            print("py-spy not found: pip install py-spy (into this environment only)")
            return 0
        for mode in ("wall", "gil"):
            with fresh_db(server, "profile") as dsn:
                enqueue_noops(dsn, args.jobs)
                raw = out / f"drain-{mode}.txt"
                flags = ["--idle"] if mode == "wall" else ["--gil"]
                wrapper = [py_spy, "record", "--format", "raw", "--rate", "200", "--nonblocking", "-o", str(raw),
                           *flags, "--"]
                spawn_worker(dsn, args.concurrency, options=options, wrapper=wrapper).wait(600)
            text = raw.read_text()
            if mode == "wall":
                print(f"\n== where the slots' wall time goes ({raw}):  share  (of which waiting on the server)")
                for name, share, wait in slot_phases(text):
                    print(f"  {share:6.1%}  ({wait:6.1%})  {name}")
            else:
                share, incl, own = cpu_functions(text)
                print(f"\n== Python CPU of the slots ({share:.0%} of the samples holding the GIL; {raw}): inclusive")
                for f, share in incl:
                    print(f"  {share:6.1%}  {f}")
                print("self:")
                for f, share in own[:15]:
                    print(f"  {share:6.1%}  {f}")
    finally:
        server.close()
        if export:
            shutil.rmtree(export, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
