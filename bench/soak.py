"""``python -m bench.soak``: the long-horizon soak of issue 16 (goal 4): is a worker flat over time?

    python -m bench.soak                     # 30 minutes on a fresh embedded server (deleted at the end)
    python -m bench.soak --quick             # 3 minutes
    python -m bench.soak --minutes 1         # any length (to try the tool)
    python -m bench.soak --rate 2600 --worker-option adaptive_limit=false   # a fixed rate, worker options
    python -m bench.soak --rev HEAD~1 --rate 2600   # skiplock as committed in a revision (before/after pairs)
    python -m bench.soak --dsn postgresql://…   # an existing server (a database is created and dropped)

What runs, in order, on one server:

1. pgbench with the claim script of ``bench/baseline.py`` (16 clients, a fresh database, right after
   a CHECKPOINT): its WAL bytes per transaction, the reference for the soak's WAL per job.
2. The capacity of the worker configuration (default 1 process × 16 slots, the public worker API
   with its default batching): a prefilled queue of 1 ms jobs drained (``bench.load.capacity``).
3. The soak: the same workers, started fresh, while a producer thread offers 1 ms ``pickup`` jobs
   at 50 % of that capacity (``bench.load.Producer``), for the whole duration D. Every 10 s a sample:
   jobs offered and completed per second, pickup latency (handler start − ``created_at``, see
   ``bench/load.py``) p50/p99/max of the jobs that finished in that interval, split at the claim
   (insert → claim p99: the job waited in the queue; claim → handler start p99: it waited in its
   claim, itself split into claim → its first job's start, the claim statement and the batch's
   bookkeeping, and the wait behind that first start: batch-mates run before it, or a hand-off), their
   jobs per claim and the database's commits per job, the cores busy (the
   server's process tree, the workers, this process: producer and sampler), the lease governor's limit
   (from the workers' DEBUG lines of ``skiplock.worker.governor``), the backlog (queued and
   running jobs), and for every table of the ``skiplock`` schema its live and dead tuples
   (``pg_stat_user_tables``; the statistics lag by up to a second), (auto)vacuum and autoanalyze
   counts, table, index and total size (``pg_relation_size``, ``pg_indexes_size``,
   ``pg_total_relation_size``) and its autovacuum threshold; the WAL position and ``pg_stat_wal``.
4. pgbench again (the mean of both runs is the reference; their ratio shows the machine's drift).

A steady state exists only if finished jobs are deleted as fast as they are made: the workers keep
done jobs ``D / 15`` seconds (120 s in the 30-minute run; ``BENCH_DONE_RETENTION_S``, read by
``bench.tasks``) and prune every ``D / 30`` seconds (60 s, skiplock's default; ``prune_interval``),
so they run through ``bench.worker`` (the public ``app.worker()`` API with that option).

The phases scale with D, as fractions of the 30-minute default: a warm-up of D/6 (the first five
minutes) is excluded from every figure; the "early" window is D/6 … D/3 (minutes 5–10) and the
"late" window the last D/6 (the last five minutes). Figures, each over the samples after the warm-up:

- the least-squares slope per minute of the interval p99 and of the relation sizes, and the ratio of
  the late mean to the early mean (goal: ≤ 1.2, flat within this machine's noise);
- the most dead tuples a table had against its autovacuum threshold at that moment
  (``autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor × reltuples``, capped by
  ``autovacuum_vacuum_max_threshold``; the table's own storage parameters where it sets them);
- WAL bytes per job (the WAL position's advance over the window / jobs completed in it) against
  pgbench's WAL per transaction. A job's WAL here is its whole life: insert, claim, done, the
  pruner's delete, vacuum, and full-page images after each checkpoint; pgbench's rows are inserted
  before it is measured. Where the WAL goes, by record type, is read with ``pg_walinspect`` over one
  late interval when the extension is available.

A server this command starts gets ``autovacuum_naptime = 1s`` (as ``python -m bench`` does). Output:
a table of the samples and one of the figures, a JSON file and a PNG plot (matplotlib, the
``bench`` extra: ``pip install -e '.[bench]'``; without it the plot is skipped, saying so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from array import array
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import psutil
import psycopg
from rich.console import Console
from rich.table import Table

from .common import (FULL, QUICK, REPO_ROOT, Child, Context, DbCounters, Figure, MachineLoad, Server, ServerCpu, fresh_db,
                     from_dsn, one, percentile, settle, start_embedded, use_revision, wait_for_workers)
from .worker import DEBUG_LOGGERS_ENV, parse_option

DEFAULT_MINUTES = 30.0
QUICK_MINUTES = 3.0
FRACTION = 0.5
LAG_S = 1.0            # a sample counts the jobs that finished up to 1 s before it (their commits are in)
FLAT_GOAL = "<= 1.2"   # late mean / early mean
CAPACITY_JOBS = {True: 3_000, False: 10_000}     # quick / full
PGBENCH_TX = {True: 4_000, False: 20_000}

console = Console(highlight=False)
if not console.is_terminal:
    console = Console(highlight=False, width=200)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, help=f"duration of the soak [{DEFAULT_MINUTES:g}; --quick: {QUICK_MINUTES:g}]")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES:g} minutes, smaller capacity and pgbench runs")
    p.add_argument("--dsn", help="an existing PostgreSQL server [default: a fresh embedded one, deleted at the end]")
    p.add_argument("--processes", type=int, default=1, help="worker processes [1]")
    p.add_argument("--concurrency", type=int, default=16, help="slots per worker process [16]")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples [10]")
    p.add_argument("--rate", type=float,
                   help="offer this many jobs/s instead of half the measured capacity (to compare runs at one rate)")
    p.add_argument("--worker-option", action="append", default=[], metavar="KEY=VALUE", type=parse_option,
                   help="app.worker(KEY=VALUE) for the soak's workers (JSON values), e.g. adaptive_limit=false")
    p.add_argument("--rev", help="soak skiplock's src/ as committed in this git revision (exported with git "
                                 "archive; the soak runs again in a process that imports it), not the working tree")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "soak.json"), help="JSON output path")
    p.add_argument("--png", default=str(REPO_ROOT / "bench" / "results" / "soak.png"), help="plot output path")
    args = p.parse_args(argv)
    if args.minutes is None:
        args.minutes = QUICK_MINUTES if args.quick else DEFAULT_MINUTES
    for name, low in (("minutes", 0.1), ("interval", 1.0)):
        if not getattr(args, name) >= low:
            p.error(f"--{name} must be at least {low:g}")
    if args.rate is not None and not args.rate > 0:
        p.error("--rate must be a positive number of jobs/s")
    if args.processes < 1 or args.concurrency < 1:
        p.error("--processes and --concurrency must be at least 1")
    if args.interval > args.minutes * 60 / 6:
        p.error(f"--interval {args.interval:g} s leaves no sample in a phase of {args.minutes * 10:g} s")
    return args


# ---- statistics -----------------------------------------------------------------------------------


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, value) points, per minute."""
    pts = [(x, y) for x, y in points if y is not None]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return None if sxx == 0 else sum((x - mx) * (y - my) for x, y in pts) / sxx


def mean_in(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
    values = [y for x, y in points if lo <= x <= hi and y is not None]
    return statistics.fmean(values) if values else None


# ---- samples --------------------------------------------------------------------------------------

TABLES = """
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.vacuum_count, s.autovacuum_count, s.autoanalyze_count,
       pg_relation_size(s.relid), pg_indexes_size(s.relid), pg_total_relation_size(s.relid),
       c.reltuples, coalesce(c.reloptions, '{}')
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.schemaname = 'skiplock'
 ORDER BY s.relname
"""


def vacuum_threshold(settings: dict[str, str], reltuples: float, reloptions: Sequence[str]) -> float:
    """The dead-tuple count at which autovacuum vacuums the table (the server's formula)."""
    opts = dict(o.split("=", 1) for o in reloptions)

    def setting(name: str) -> float | None:
        value = opts.get(name, settings.get(name))
        return None if value is None else float(value)

    threshold = (setting("autovacuum_vacuum_threshold") or 0.0) + \
        (setting("autovacuum_vacuum_scale_factor") or 0.0) * max(0.0, reltuples)
    cap = setting("autovacuum_vacuum_max_threshold")  # PostgreSQL 18+; -1 disables the cap
    return min(threshold, cap) if cap is not None and cap >= 0 else threshold


def read_settings(c: psycopg.Connection[Any]) -> dict[str, str]:
    names = ["autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_max_threshold",
             "autovacuum_naptime", "checkpoint_timeout", "max_wal_size", "full_page_writes", "wal_level"]
    return dict(c.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]).fetchall())


class Sampler:
    """One sample every ``interval`` seconds of the soak database (see the module docstring)."""

    def __init__(self, dsn: str, producer: Any, settings: dict[str, str], cpu: ServerCpu, workers: Sequence[Child]):
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.producer = producer
        self.dsn, self.server_cpu, self.workers = dsn, cpu, list(workers)
        self.counters = DbCounters.read(dsn, cpu)  # commits in the database, the server's CPU
        self.cpu = self._cpu()
        self.settings = settings
        self.samples: list[dict[str, Any]] = []
        self.latencies = array("d")      # every job's pickup latency (s) after the warm-up
        self.t0 = time.monotonic()
        self.bound = self._server_now() - LAG_S
        self.sent = producer.sent
        self.at = time.monotonic()
        self.last_lsn = self._wal()[0]

    def _cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the workers and of this process (the producer, the sampler); the
        server's is in ``DbCounters``."""
        me = psutil.Process().cpu_times()
        workers = 0.0
        for w in self.workers:
            try:
                workers += w.cpu_now()
            except psutil.Error:
                pass
        return workers, me.user + me.system

    def _server_now(self) -> float:
        return float(one(self.conn, "SELECT extract(epoch FROM clock_timestamp())::float8")[0])

    def _wal(self) -> tuple[int, int, int]:
        lsn = int(one(self.conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0])
        records, fpi = one(self.conn, "SELECT wal_records, wal_fpi FROM pg_stat_wal")
        return lsn, int(records), int(fpi)

    def sample(self, minute: float, warm: bool) -> dict[str, Any]:
        """The sample due at ``minute`` (nominal: the phases are judged on the schedule, not on when
        a busy machine got round to it; the actual time is kept as ``at_minute``)."""
        from .load import pickup_rows, queue_depth_on

        c = self.conn
        now = self._server_now()
        bound = now - LAG_S
        rows = pickup_rows(c, self.bound, bound)
        lat = [r[2] - r[1] for r in rows]
        # where the latency sat: insert -> claim (the job waited in the queue for a slot to claim it)
        # and claim -> handler start (it waited behind its batch-mates in the claim); jobs with the same
        # started_at (the claim transaction's start) came from one claim
        to_claim = [r[4] - r[1] for r in rows]
        in_claim = [r[2] - r[4] for r in rows]
        claims = len({r[4] for r in rows})
        # and within the claim: until its first job started (the claim statement, the batch's
        # bookkeeping), and from there (behind batch-mates, or waiting for a slot it was handed to)
        first: dict[float, float] = {}
        for r in rows:
            first[r[4]] = min(first.get(r[4], r[2]), r[2])
        to_first = [first[r[4]] - r[4] for r in rows]
        behind = [r[2] - first[r[4]] for r in rows]
        counters = DbCounters.read(self.dsn, self.server_cpu)
        counted = self.counters.delta(counters)  # (its commits include the sampler's own few)
        at, sent = time.monotonic(), self.producer.sent
        calls = self.producer.take_calls()
        cpu = self._cpu()
        # cores busy during the interval: the machine has os.cpu_count() of them in all
        server_s = counted["server_cpu_s"]
        cores = {"server": None if server_s is None else server_s / counted["seconds"],
                 "workers": (cpu[0] - self.cpu[0]) / (at - self.at), "bench": (cpu[1] - self.cpu[1]) / (at - self.at)}
        queued, running = queue_depth_on(c)
        c.execute("SELECT pg_stat_clear_snapshot()")
        tables: dict[str, dict[str, Any]] = {}
        for (name, live, dead, vac, autovac, autoanalyze, heap, idx, total, reltuples, reloptions) \
                in c.execute(TABLES).fetchall():
            tables[name] = {"live": live, "dead": dead, "vacuums": vac, "autovacuums": autovac,
                            "autoanalyzes": autoanalyze, "table_bytes": heap, "index_bytes": idx, "total_bytes": total,
                            "reltuples": reltuples,
                            "vacuum_threshold": vacuum_threshold(self.settings, reltuples, reloptions)}
        lsn, records, fpi = self._wal()
        s = {
            "minute": minute, "at_minute": (at - self.t0) / 60, "warm": warm, "seconds": bound - self.bound,
            "window_epoch": (self.bound, bound),
            "offered_per_s": (sent - self.sent) / (at - self.at), "done_per_s": len(rows) / (bound - self.bound),
            "jobs_done": len(rows),
            "p50_ms": percentile(lat, 50) * 1000 if lat else None, "p99_ms": percentile(lat, 99) * 1000 if lat else None,
            "max_ms": max(lat) * 1000 if lat else None,
            "enqueue_call_p99_ms": percentile([c[3] - c[2] for c in calls], 99) * 1000 if calls else None,
            "to_claim_p99_ms": percentile(to_claim, 99) * 1000 if rows else None,
            "claim_to_start_p99_ms": percentile(in_claim, 99) * 1000 if rows else None,
            "claim_to_first_p99_ms": percentile(to_first, 99) * 1000 if rows else None,
            "behind_first_p99_ms": percentile(behind, 99) * 1000 if rows else None,
            "jobs_per_claim": len(rows) / claims if claims else None,
            "commits_per_job": counted["xact_commit"] / len(rows) if rows else None,
            "cores": cores,
            "queued": queued, "running": running, "tables": tables,
            "wal_lsn": lsn, "wal_records": records, "wal_fpi": fpi, "wal_bytes_per_s": (lsn - self.last_lsn) / (at - self.at),
        }
        if warm:
            self.latencies.extend(lat)
        self.bound, self.sent, self.at, self.last_lsn, self.counters, self.cpu = bound, sent, at, lsn, counters, cpu
        self.samples.append(s)
        return s

    def close(self) -> None:
        self.conn.close()


def wal_breakdown(dsn: str, start_lsn: int, end_lsn: int, jobs: int) -> list[dict[str, Any]] | str:
    """Bytes per job by WAL record type between two positions (pg_walinspect), or why not."""
    if jobs <= 0 or end_lsn <= start_lsn:
        return "no jobs in the interval"
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            rows = c.execute(
                "SELECT \"resource_manager/record_type\", count, record_size, fpi_size, combined_size"
                "  FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0"
                " ORDER BY combined_size DESC LIMIT 15",
                [lsn_text(start_lsn), lsn_text(end_lsn)]).fetchall()
    except psycopg.Error as exc:
        return f"pg_walinspect unavailable: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return [{"record": name, "per_job": n / jobs, "record_bytes_per_job": rec / jobs, "fpi_bytes_per_job": fpi / jobs,
             "bytes_per_job": total / jobs} for name, n, rec, fpi, total in rows]


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# ---- the run --------------------------------------------------------------------------------------


def done_retention(duration: float, interval: float) -> float:
    """Seconds done jobs are kept: D/15 (120 s at most), and long enough for every job to be read by
    the sample after the one it finished in (latency and completions are read back from the jobs)."""
    return min(120.0, max(2.5 * interval + LAG_S, duration / 15))


def prune_interval(duration: float) -> float:
    return max(2.0, min(60.0, duration / 30))


def fmt_min(m: float) -> str:
    return f"{m:g} min" if m >= 2 else f"{m * 60:g} s"


def pgbench_wal(ctx: Context, label: str, tx: int) -> dict[str, Any]:
    from .baseline import claim_run

    n, _, result, delta, done = claim_run(ctx, label, tx)
    if done != n or result["failed"]:
        raise RuntimeError(f"pgbench: {done} rows done of {n}, {result['failed']} failed")
    return {"transactions": n, "tps": result["tps"], "wal_bytes_per_tx": delta["wal_bytes"] / n}


def soak(ctx: Context, args: argparse.Namespace, rate: float, settings: dict[str, str]) -> dict[str, Any]:
    from .load import Producer, stop_all, summary_of
    from .tasks import RETENTION_ENV

    duration = args.minutes * 60
    retention, prune = done_retention(duration, args.interval), prune_interval(duration)
    warmup_min = args.minutes / 6
    with fresh_db(ctx.server, "soak") as dsn:
        producer = Producer(dsn, rate)
        env = {RETENTION_ENV: str(retention), DEBUG_LOGGERS_ENV: GOVERNOR_LOGGER}  # the lease limit's moves
        workers = [ctx.worker(dsn, args.concurrency, stop_when_empty=False, env=env) for _ in range(args.processes)]
        sampler: Sampler | None = None
        stopped_early: str | None = None
        late_interval: tuple[int, int, int] | None = None
        try:
            wait_for_workers(dsn, args.processes)
            producer.start()
            sampler = Sampler(dsn, producer, settings, ctx.cpu(), workers)
            ctx.log(f"soak: {args.minutes:g} min at {rate:,.0f} jobs/s, {args.processes} × {args.concurrency} slots, "
                    f"done jobs kept {retention:g} s, pruned every {prune:g} s; a sample every {args.interval:g} s")
            k = 0
            while True:
                k += 1
                next_at = sampler.t0 + k * args.interval
                if next_at > sampler.t0 + duration + 0.5:
                    break
                time.sleep(max(0.0, next_at - time.monotonic()))
                previous_lsn = sampler.last_lsn
                minute = k * args.interval / 60
                s = sampler.sample(minute, warm=minute > warmup_min + 1e-9)
                if s["warm"] and s["jobs_done"]:
                    late_interval = (previous_lsn, s["wal_lsn"], s["jobs_done"])
                jobs = s["tables"].get("jobs", {})
                ctx.log(f"soak {s['minute']:5.1f} min: {s['offered_per_s']:,.0f} offered/s, {s['done_per_s']:,.0f} done/s, "
                        f"p99 {fmt_ms(s['p99_ms'])} ms (to claim {fmt_ms(s['to_claim_p99_ms'])}), "
                        f"{s['jobs_per_claim'] or 0:.1f} jobs/claim, cores {fmt_cores(s['cores'])}, "
                        f"backlog {s['queued'] + s['running']:,}, jobs "
                        f"{jobs.get('live', 0):,} live / {jobs.get('dead', 0):,} dead, "
                        f"{jobs.get('total_bytes', 0) / 2**20:.1f} MiB")
                if producer.error is not None:
                    stopped_early = f"producer failed: {producer.error!r}"
                    break
                dead = [w for w in workers if w.poll() is not None]
                if dead:
                    stopped_early = f"worker exited with {dead[0].result.returncode if dead[0].result else '?'}"
                    break
        finally:
            try:
                if producer.is_alive():
                    try:
                        producer.stop()
                    except RuntimeError as exc:
                        stopped_early = stopped_early or str(exc)
                if sampler is not None:
                    sampler.close()
            finally:
                finished = stop_all(workers, 60)
        breakdown = wal_breakdown(dsn, *late_interval) if late_interval else "no warm interval"
        settle(dsn)
    assert sampler is not None
    lease_limits(sampler.samples, [limit_moves(f.stderr) for f in finished])
    governor_lines = [[line for line in f.stderr.splitlines() if GOVERNOR_LINE.match(line)] for f in finished]
    return {"rate_target": rate, "rate_fixed": args.rate is not None, "producer_achieved_rate": producer.achieved_rate(),
            "retention_done_s": retention,
            "prune_interval_s": prune, "warmup_minutes": warmup_min, "samples": sampler.samples,
            "latencies_s": sampler.latencies, "stopped_early": stopped_early, "wal_breakdown_late_interval": breakdown,
            "worker_exits": [f.returncode for f in finished], "workers": [summary_of(f.stderr) for f in finished],
            "lease_limit_lines": governor_lines}


GOVERNOR_LOGGER = "skiplock.worker.governor"
GOVERNOR_LINE = re.compile(r"^\S+ \S+ DEBUG skiplock\.worker\.governor: ")
LIMIT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) DEBUG skiplock\.worker\.governor: "
                        r"lease limit (?:starts at|\d+ ->) (\d+) of \d+ slots")


def limit_moves(stderr: str) -> list[tuple[float, int]]:
    """A worker's lease limit over time, from its log (``bench.worker`` with the governor's logger at
    DEBUG): (epoch seconds, the limit from then on), the first one its start."""
    moves = []
    for line in stderr.splitlines():
        m = LIMIT_LINE.match(line)
        if m:  # logging's asctime: local time, milliseconds after the comma
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            moves.append((at, int(m.group(2))))
    return moves


def lease_limits(samples: list[dict[str, Any]], moves: Sequence[list[tuple[float, int]]]) -> None:
    """Adds to every sample its workers' lease limit, summed over the processes: the time-weighted
    mean over the sample's window (``limit_mean``), the lowest and highest (``limit_min``,
    ``limit_max``); None for all when a worker logged none (an older worker, or one that logs no
    DEBUG). The windows are on the server's clock and the lines on the workers': the same clock
    unless ``--dsn`` names a server on another machine."""
    for s in samples:
        lo, hi = s["window_epoch"]
        means, mins, maxes = [], [], []
        for events in moves:
            if not events or hi <= lo:
                break
            limit = events[0][1]  # its start (a window before it: the start)
            area, low, high = 0.0, None, None
            at = lo
            for t, value in events:
                if t <= lo:
                    limit = value
                    continue
                if t >= hi:
                    break
                area += limit * (t - at)
                low = limit if low is None else min(low, limit)
                high = limit if high is None else max(high, limit)
                at, limit = t, value
            area += limit * (hi - at)
            means.append(area / (hi - lo))
            mins.append(limit if low is None else min(low, limit))
            maxes.append(limit if high is None else max(high, limit))
        ok = len(means) == len(moves) and moves
        s["limit_mean"] = sum(means) if ok else None
        s["limit_min"] = sum(mins) if ok else None  # (the sum of each process's lowest)
        s["limit_max"] = sum(maxes) if ok else None


def fmt_cores(cores: dict[str, float | None] | None) -> str:
    if not cores:
        return ""
    return "/".join("–" if cores.get(k) is None else f"{cores[k]:.2f}" for k in ("server", "workers", "bench"))


def fmt_ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def figures_of(r: dict[str, Any], cap: dict[str, Any], wal_ref: float, minutes: float) -> list[Figure]:
    from .load import P50_TARGET_MS, P99_TARGET_MS

    samples = [s for s in r["samples"] if s["warm"]]
    early = (minutes / 6, minutes / 3)
    late = (minutes * 5 / 6, minutes)
    fig: list[Figure] = []
    S = "soak"
    cell = f"{cap['processes']} × {cap['slots']}"
    fig.append(Figure(S, f"capacity, {cell} slots, {cap['jobs']:,} prefilled 1 ms jobs", cap["throughput"], "jobs/s"))
    offered = statistics.fmean(s["offered_per_s"] for s in samples) if samples else None
    done = statistics.fmean(s["done_per_s"] for s in samples) if samples else None
    fig.append(Figure(S, f"offered rate after the warm-up ({'--rate' if r['rate_fixed'] else f'{FRACTION:.0%} of capacity'})",
                      offered, "jobs/s",
                      baseline_or_target=r["rate_target"], reference="target", goal=">= 0.95"))
    fig.append(Figure(S, "completions after the warm-up", done, "jobs/s", baseline_or_target=offered,
                      reference="offered"))
    lat = r["latencies_s"]
    if lat:
        ms = sorted(v * 1000 for v in lat)  # sorted once (percentile's own sort is then linear)
        fig.append(Figure(S, "pickup latency p50, all jobs after the warm-up", percentile(ms, 50), "ms",
                          baseline_or_target=P50_TARGET_MS, reference="target", goal="<= 1"))
        fig.append(Figure(S, "pickup latency p99, all jobs after the warm-up", percentile(ms, 99), "ms",
                          baseline_or_target=P99_TARGET_MS, reference="target", goal="<= 1",
                          details={"max_ms": max(ms), "jobs": len(ms)}))

    busy = [sum(v for v in s["cores"].values() if v is not None) for s in samples if s.get("cores")]
    if busy:
        # how close to the machine's limit "half the capacity" was: the capacity is a drain of a
        # prefilled queue, without the producer's inserts and the producer itself on the same cores
        fig.append(Figure(S, "cores busy after the warm-up (server + workers + producer), mean / most in an interval",
                          statistics.fmean(busy), "cores", baseline_or_target=float(os.cpu_count() or 1),
                          reference="the machine's cores", details={"most": max(busy)}))
    stalled = [s for s in samples if s.get("max_ms") is not None and s["max_ms"] > 10 * P99_TARGET_MS]
    fig.append(Figure(S, f"intervals after the warm-up with a pickup over {10 * P99_TARGET_MS:g} ms", len(stalled),
                      "intervals", details={"of": len(samples), "minutes": [round(s["minute"], 2) for s in stalled]}))

    limited = [s for s in samples if s.get("limit_mean") is not None]
    if limited:
        # the lease governor (worker/governor.py) cut its limit below its highest: did the stalls
        # (above) come with cuts?
        top = max(s["limit_max"] for s in limited)
        cut = [s for s in limited if s["limit_min"] < top]
        fig.append(Figure(S, "intervals after the warm-up with the lease limit below its highest", len(cut), "intervals",
                          details={"of": len(limited), "highest": top, "minutes": [round(s["minute"], 2) for s in cut],
                                   "stalled_and_cut": [round(s["minute"], 2) for s in stalled if s in cut],
                                   "mean_limit": statistics.fmean(s["limit_mean"] for s in limited)}))

    def trend(name: str, unit: str, scale: float, points: list[tuple[float, float]]) -> None:
        slope = slope_per_minute(points)
        e, l = mean_in(points, *early), mean_in(points, *late)
        fig.append(Figure(S, f"{name}: least-squares slope after the warm-up", None if slope is None else slope / scale,
                          f"{unit}/min", details={"mean": None if not points else statistics.fmean(y for _, y in points) / scale}))
        fig.append(Figure(S, f"{name}: mean of the last {fmt_min(minutes / 6)} / mean from "
                             f"{fmt_min(early[0])} to {fmt_min(early[1])}", None if l is None else l / scale, unit,
                          baseline_or_target=None if e is None else e / scale, reference="early window", goal=FLAT_GOAL))

    trend("pickup p99 per interval", "ms", 1.0, [(s["minute"], s["p99_ms"]) for s in samples if s["p99_ms"] is not None])
    for table in ("jobs", "job_attempts"):
        trend(f"skiplock.{table} total size", "MiB", 2**20,
              [(s["minute"], s["tables"][table]["total_bytes"]) for s in samples if table in s["tables"]])
    trend("all skiplock tables, total size", "MiB", 2**20,
          [(s["minute"], sum(t["total_bytes"] for t in s["tables"].values())) for s in samples])
    names = sorted({n for s in samples for n, t in s["tables"].items() if t["dead"]} | {"jobs", "job_attempts"})
    for table in names:
        rows = [s["tables"][table] for s in samples if table in s["tables"]]
        if not rows:
            continue
        worst = max(rows, key=lambda t: t["dead"] / max(1.0, t["vacuum_threshold"]))
        fig.append(Figure(S, f"skiplock.{table} dead tuples, most after the warm-up", worst["dead"], "tuples",
                          baseline_or_target=worst["vacuum_threshold"], reference="autovacuum threshold", goal="<= 1",
                          details={"autovacuums_during_soak": rows[-1]["autovacuums"] - rows[0]["autovacuums"],
                                   "mean_dead": statistics.fmean(t["dead"] for t in rows)}))
    if len(samples) >= 2:
        jobs = sum(s["jobs_done"] for s in samples[1:])
        wal = samples[-1]["wal_lsn"] - samples[0]["wal_lsn"]
        fpi = samples[-1]["wal_fpi"] - samples[0]["wal_fpi"]
        records = samples[-1]["wal_records"] - samples[0]["wal_records"]
        if jobs:
            fig.append(Figure(S, "WAL per job after the warm-up (insert, claim, done, prune, vacuum, FPIs)", wal / jobs,
                              "bytes/job", baseline_or_target=wal_ref, reference="pgbench WAL per tx",
                              details={"wal_records_per_job": records / jobs, "full_page_images_per_job": fpi / jobs,
                                       "jobs": jobs, "wal_bytes": wal}))
    fig.append(Figure(S, "WAL per job of the capacity drain (claim + done only, as pgbench's)",
                      cap["wal_bytes_per_job"], "bytes/job", baseline_or_target=wal_ref, reference="pgbench WAL per tx",
                      note="the issue's 1.8x is this ratio"))
    problems = sum(w["problems"] for w in r["workers"])
    fig.append(Figure(S, "worker log lines reporting a problem", problems, "count", baseline_or_target=0, goal="== 0",
                      goal_on="value", details={"lines": [line for w in r["workers"] for line in w["problem_lines"]]}))
    return fig


def sample_table(samples: list[dict[str, Any]]) -> Table:
    t = Table(title="soak samples (jobs = skiplock.jobs, attempts = skiplock.job_attempts; sizes are total relation sizes)")
    cols = ["min", "offered/s", "done/s", "p50 ms", "p99 ms", "→claim p99", "claim→start p99", "claim→1st p99",
            "behind 1st p99", "jobs/claim",
            "cores srv/wrk/bench", "lease limit mean/min", "enqueue p99 ms",
            "backlog", "jobs live", "jobs dead", "jobs thr", "jobs MiB", "jobs idx MiB", "jobs autovac", "attempts dead",
            "attempts MiB", "WAL MB/s"]
    for col in cols:
        t.add_column(col, justify="right")
    for s in samples:
        j = s["tables"].get("jobs", {})
        a = s["tables"].get("job_attempts", {})
        t.add_row(f"{s['minute']:.1f}{'' if s['warm'] else '*'}", f"{s['offered_per_s']:,.0f}", f"{s['done_per_s']:,.0f}",
                  fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]), fmt_ms(s.get("to_claim_p99_ms")),
                  fmt_ms(s.get("claim_to_start_p99_ms")), fmt_ms(s.get("claim_to_first_p99_ms")),
                  fmt_ms(s.get("behind_first_p99_ms")),
                  "" if s.get("jobs_per_claim") is None else f"{s['jobs_per_claim']:.1f}", fmt_cores(s.get("cores")),
                  "–" if s.get("limit_mean") is None else f"{s['limit_mean']:.1f}/{s['limit_min']}",
                  fmt_ms(s["enqueue_call_p99_ms"]),
                  f"{s['queued'] + s['running']:,}", f"{j.get('live', 0):,}",
                  f"{j.get('dead', 0):,}", f"{j.get('vacuum_threshold', 0):,.0f}", f"{j.get('total_bytes', 0) / 2**20:.1f}",
                  f"{j.get('index_bytes', 0) / 2**20:.1f}", f"{j.get('autovacuums', 0)}", f"{a.get('dead', 0):,}",
                  f"{a.get('total_bytes', 0) / 2**20:.1f}", f"{s['wal_bytes_per_s'] / 1e6:.2f}")
    t.caption = "* warm-up, excluded from the figures"
    return t


def plot(samples: list[dict[str, Any]], path: Path, title: str, warmup_min: float) -> str | None:
    """The samples as a PNG; None, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    from .load import P50_TARGET_MS, P99_TARGET_MS

    x = [s["minute"] for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    ax = axes[0]
    ax.plot(x, [s["offered_per_s"] for s in samples], label="offered/s")
    ax.plot(x, [s["done_per_s"] for s in samples], label="done/s")
    ax.set_ylabel("jobs/s")
    ax.set_ylim(bottom=0)
    twin = ax.twinx()
    twin.plot(x, [s["queued"] + s["running"] for s in samples], color="grey", linestyle=":", label="backlog")
    twin.set_ylabel("backlog (jobs)")
    ax.legend(loc="upper left")
    twin.legend(loc="upper right")
    ax = axes[1]
    ax.plot(x, [s["p50_ms"] for s in samples], label="p50")
    ax.plot(x, [s["p99_ms"] for s in samples], label="p99")
    ax.axhline(P50_TARGET_MS, color="C0", linestyle="--", linewidth=0.8, label=f"p50 goal {P50_TARGET_MS:g} ms")
    ax.axhline(P99_TARGET_MS, color="C1", linestyle="--", linewidth=0.8, label=f"p99 goal {P99_TARGET_MS:g} ms")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("pickup latency (ms)")
    ax.legend(loc="upper left")
    ax = axes[2]
    for i, table in enumerate(("jobs", "job_attempts")):
        ax.plot(x, [s["tables"].get(table, {}).get("dead") for s in samples], color=f"C{i}", label=f"{table} dead")
        ax.plot(x, [s["tables"].get(table, {}).get("vacuum_threshold") for s in samples], color=f"C{i}",
                linestyle="--", linewidth=0.8, label=f"{table} autovacuum threshold")
    ax.set_ylabel("dead tuples")
    ax.legend(loc="upper left")
    ax = axes[3]
    for key, label in (("table_bytes", "jobs table"), ("index_bytes", "jobs indexes")):
        ax.plot(x, [s["tables"].get("jobs", {}).get(key, 0) / 2**20 for s in samples], label=label)
    ax.plot(x, [s["tables"].get("job_attempts", {}).get("total_bytes", 0) / 2**20 for s in samples],
            label="job_attempts total")
    ax.set_ylabel("MiB")
    ax.set_xlabel("minutes")
    ax.legend(loc="upper left")
    for a in axes:
        a.axvspan(0, warmup_min, color="grey", alpha=0.1)
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


REV_ENV = "BENCH_SOAK_REVISION"  # set for the process --rev starts: what it exported (JSON)


def run_revision(args: argparse.Namespace, argv: list[str] | None) -> None:
    """``--rev``: export that revision's src/ and run the soak again in a process that imports it
    (this one has imported the working tree's skiplock already: bench.tasks); its workers inherit
    the path. Does not return."""
    info = use_revision(args.rev)
    os.environ[REV_ENV] = json.dumps(info)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "bench.soak", *(argv if argv is not None else sys.argv[1:])])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rev and REV_ENV not in os.environ:
        run_revision(args, argv)
    from . import __main__ as bench_main
    from .load import capacity

    t0 = time.perf_counter()
    started = time.time()
    quick = args.quick or args.minutes < QUICK_MINUTES * 2
    server: Server = from_dsn(args.dsn) if args.dsn else start_embedded(None)
    ctx = Context(server=server, sizes=QUICK if quick else FULL, drain_concurrency=[args.concurrency],
                  latency_concurrency=args.concurrency, worker_options={},
                  log=lambda msg: console.print(f"[dim]{time.perf_counter() - t0:7.1f}s[/] {msg}"))
    figures: list[Figure] = []
    try:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            settings = read_settings(c)
        meta: dict[str, Any] = {
            "command": " ".join(["python", "-m", "bench.soak", *(argv if argv is not None else sys.argv[1:])]),
            "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
            "quick": args.quick, "minutes": args.minutes, "interval_s": args.interval,
            "machine": bench_main.machine_info(), "server": server.version(),
            "git": json.loads(os.environ[REV_ENV]) if args.rev else bench_main.git_info(),
            "server_kind": "external (--dsn)" if args.dsn else "embedded", "server_settings": settings,
            "worker": {"runner": "bench.worker", "processes": args.processes, "concurrency": args.concurrency,
                       "options": dict(args.worker_option)},
            "rate": args.rate,
            "load_average_start": os.getloadavg(),
        }
        load = MachineLoad(ctx.cpu())
        tx = PGBENCH_TX[quick]
        ctx.log(f"soak: pgbench claim script, {tx:,} transactions (WAL reference)")
        pg_start = pgbench_wal(ctx, "soak_pgbench_start", tx)
        n = CAPACITY_JOBS[quick]
        ctx.log(f"soak: capacity of {args.processes} × {args.concurrency} slots, {n:,} prefilled 1 ms jobs")
        cap = capacity(ctx, args.processes, args.concurrency, n, "soak_capacity")
        ctx.log(f"soak: capacity {cap['throughput']:,.0f} jobs/s")
        # the soak's workers prune on the soak's schedule: through bench.worker (app.worker(prune_interval=...))
        duration = args.minutes * 60
        ctx.worker_options = {"prune_interval": prune_interval(duration), **dict(args.worker_option)}
        r = soak(ctx, args, args.rate or FRACTION * cap["throughput"], settings)
        ctx.worker_options = {}
        ctx.log("soak: pgbench again (WAL reference, machine drift)")
        pg_end = pgbench_wal(ctx, "soak_pgbench_end", tx)
        wal_ref = (pg_start["wal_bytes_per_tx"] + pg_end["wal_bytes_per_tx"]) / 2
        figures = figures_of(r, cap, wal_ref, args.minutes)
        figures.append(Figure("soak", "pgbench WAL per transaction (mean of the runs before and after)", wal_ref,
                              "bytes/tx", details={"start": pg_start, "end": pg_end}))
        figures.append(Figure("baseline", "pgbench TPS drift, end run / start run", pg_end["tps"] / pg_start["tps"], "×",
                              note="how much the machine's capacity moved during the run"))
        other = load.other_cores()
        figures.append(Figure("machine", "CPU used by other processes during the run", other, "cores",
                              note=f"of {os.cpu_count()}: other people's work on this machine"))
        if r["stopped_early"]:
            figures.append(Figure("soak", f"stopped early: {r['stopped_early']}", None, ""))
        meta.update(duration_s=time.perf_counter() - t0, load_average_end=os.getloadavg(),
                    retention_done_s=r["retention_done_s"], prune_interval_s=r["prune_interval_s"],
                    warmup_minutes=r["warmup_minutes"], rate_target=r["rate_target"],
                    producer_achieved_rate=r["producer_achieved_rate"])
    finally:
        server.close()
    out = {"meta": meta, "figures": [f.to_json() for f in figures], "capacity": cap,
           "pgbench": {"start": pg_start, "end": pg_end}, "samples": r["samples"],
           "wal_breakdown_late_interval": r["wal_breakdown_late_interval"],
           "workers": r["workers"], "worker_exits": r["worker_exits"],
           "lease_limit_lines": r["lease_limit_lines"]}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    console.print(sample_table(r["samples"]))
    breakdown = r["wal_breakdown_late_interval"]
    if isinstance(breakdown, list):
        t = Table(title="WAL by record type, one interval after the warm-up (pg_walinspect)")
        for col in ("record", "records/job", "bytes/job", "of which FPI"):
            t.add_column(col, justify="left" if col == "record" else "right")
        for b in breakdown:
            t.add_row(b["record"], f"{b['per_job']:.2f}", f"{b['bytes_per_job']:.0f}", f"{b['fpi_bytes_per_job']:.0f}")
        console.print(t)
    else:
        console.print(f"[dim]WAL by record type: {breakdown}[/]")
    bench_main.print_table(figures, {**meta, "quick": args.quick})
    why_not = plot(r["samples"], Path(args.png), f"skiplock soak: {args.minutes:g} min, {r['rate_target']:,.0f} jobs/s "
                   f"offered, {args.processes} × {args.concurrency} slots", r["warmup_minutes"])
    goals = [f for f in figures if f.target_met is not None]
    console.print(f"{sum(1 for f in goals if f.target_met)}/{len(goals)} targets met; {meta['duration_s']:.0f} s; "
                  f"JSON: {path}; plot: {args.png if why_not is None else 'not written, ' + why_not}")
    return 1 if r["stopped_early"] else 0


if __name__ == "__main__":
    sys.exit(main())
