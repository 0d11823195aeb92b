"""The two lease modes compared: connections held, throughput, and what a hung worker does to the table.

``run(dsn, quick=False) -> dict`` (the harness entry point) or ``python -m bench.leases`` /
``python bench/leases.py [--dsn DSN | --data-dir DIR] [--quick] [--out PATH]``, which writes one JSON
object (default ``bench/results/leases.json``) and prints a summary. Without ``--dsn`` it starts the
embedded server (``skiplock.backend.postgres.embedded.ensure_server``): in ``--data-dir`` (left running), else in a
fresh temporary directory that is stopped and deleted at the end. ``dsn`` must allow CREATE DATABASE:
every scenario gets a database of its own (``CREATE DATABASE``, then ``skiplock.App(dsn).migrate()``),
dropped afterwards.

Workers are separate processes (this file with ``--worker``: ``app.worker(...).run()``, the public
API), so the measuring process never shares their interpreter lock. Tasks are defined in
:func:`make_app`: the same handlers with ``lease="transaction"`` (the default) and ``lease="claimed"``.

1. ``connections``: N jobs that sleep S seconds, one worker with N slots, per mode. ``pg_stat_activity``
   of the database is sampled every 0.1 s; samples in which all N jobs are in flight (transaction
   lease: N rows in ``job_attempts``; claimed lease: N rows ``running``) are summarised: worker lease
   sessions (``application_name LIKE 'skiplock-worker%'``) and all skiplock sessions, how many are in an
   open transaction (``xact_start IS NOT NULL``), and how many hold a transaction id (``backend_xid``):
   an xid is what holds back vacuum.
2. ``throughput``: N no-op jobs, one worker with C slots, per mode, rounds interleaved
   (transaction, claimed, transaction, ...), each round in a fresh database. Throughput = jobs /
   (last ``finished_at`` - first ``started_at``), both on the server's clock, as in bench/drain.py.
   Wall-clock rates on a busy shared machine swing by tens of percent between rounds, so the CPU each
   job costs is measured too: the worker process's (rusage, minus a worker's start-up CPU on an empty
   queue) and the server's (its process tree, when it runs on this machine).
3. ``hung_worker``: one job in queue ``hung`` whose handler sleeps an hour on its first attempt
   (and returns at once on later ones) is claimed by a worker of its own (1 slot), which is then
   frozen with SIGSTOP: a hung worker. Another worker (C slots, all queues) then drains N no-op
   transaction-lease jobs. Every ``sample_every`` seconds: ``n_live_tup``/``n_dead_tup`` and (auto)vacuum
   counts of ``skiplock.jobs`` (pg_stat_user_tables; the workers' backends flush their counts at most
   once a second, so they lag by about that), heap / index / total size, the hung session's state and
   xid age, and claim latency (a probe on its own lease connection: BEGIN; the workers' claim query;
   ROLLBACK, ``probes_per_sample`` times, median). After the drain: ``VACUUM (VERBOSE) skiplock.jobs``
   with the hung worker still there, then the hung worker is SIGKILLed and VACUUM runs again; VACUUM's
   own report (tuples removed / dead but not yet removable, removable cutoff) is parsed, and the
   sessions holding an xid or a snapshot (the "horizon holders") are recorded. The claim probe also
   runs the claim once under EXPLAIN (ANALYZE, BUFFERS): buffers touched per claim, a cost measure that
   does not depend on machine load. The hung worker is a real skiplock worker frozen mid-job (not a
   hand-written session), so its sessions are exactly what a hung skiplock worker leaves. Scenarios:
   a. ``transaction``: the hung job is a transaction-lease job (default ``lease_timeout=600``): its
      session stays idle in transaction, holding an xid, for the whole run.
   b. ``claimed``: the hung job is a claimed-lease job: its worker holds no transaction; its lease
      (``hung_lease_seconds``) expires, the rescuer of the other worker requeues it, attempt 2 runs.
   c. ``transaction_bounded``: as (a) with ``App(lease_timeout=bounded_lease_timeout)``: the server
      ends the hung session (idle_in_transaction_session_timeout / transaction_timeout), the job is
      redone by the other worker, and the dead rows become removable.

The machine may be shared and small: compare figures within one run (ratios), not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, cast

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "leases.json"
HANG_SECONDS = 3600.0
MONITOR_APP = "bench-leases-monitor"
PROBE_APP = "bench-leases-probe"
KEY_PROBES = 15  # claim probes at the before / after-drain / after-VACUUM points (median)
PARTS = ("connections", "throughput", "hung")


@dataclass(frozen=True)
class Sizes:
    slow_jobs: int = 8
    slow_seconds: float = 2.0
    slow_concurrency: int = 8
    noop_jobs: int = 3000
    noop_concurrency: int = 4
    throughput_rounds: int = 3           # per mode, interleaved
    bloat_jobs: int = 20_000
    bloat_concurrency: int = 4
    sample_every: float = 2.0
    probes_per_sample: int = 3
    bounded_lease_timeout: float = 10.0  # App(lease_timeout=...) of scenario (c)
    hung_lease_seconds: float = 5.0      # lease_seconds of the hung claimed-lease job (b)
    drain_cap_seconds: float = 120.0     # per hung-worker scenario: stop waiting for the drain
    hung_job_wait_seconds: float = 30.0  # after the drain, wait this long for the hung job to be redone


FULL = Sizes()
QUICK = Sizes(slow_seconds=1.5, noop_jobs=1000, throughput_rounds=1, bloat_jobs=4000, sample_every=1.0,
              drain_cap_seconds=40.0)


# ---- the tasks and the worker process ------------------------------------------------------------

def make_app(dsn: str, lease_timeout: float = 600.0, hung_lease_seconds: float | None = None) -> Any:
    """The benchmark's tasks, each in both lease modes. ``hang_claimed`` is registered only when
    ``hung_lease_seconds`` is given (its short lease sets the worker's heartbeat interval)."""
    import skiplock

    app = skiplock.App(dsn, lease_timeout=lease_timeout)

    @app.task(name="noop")
    def noop(job: Any) -> None:
        pass

    @app.task(name="noop_claimed", lease="claimed", lease_seconds=60)
    def noop_claimed(job: Any) -> None:
        pass

    @app.task(name="sleep")
    def sleep_(job: Any, seconds: float) -> None:
        time.sleep(seconds)

    @app.task(name="sleep_claimed", lease="claimed", lease_seconds=60)
    def sleep_claimed(job: Any, seconds: float) -> None:
        time.sleep(seconds)

    def hang(job: Any, seconds: float) -> None:
        if job.attempt == 1:  # the first attempt hangs; a redo (after the lease ended) returns at once
            time.sleep(seconds)

    app.task(name="hang", queue="hung")(hang)
    if hung_lease_seconds is not None:
        app.task(name="hang_claimed", queue="hung", lease="claimed", lease_seconds=hung_lease_seconds)(hang)
    return app


def worker_main(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_app(args.dsn, args.lease_timeout, args.hung_lease_seconds)
    queues = args.queues.split(",") if args.queues else None
    worker = app.worker(queues=queues, concurrency=args.concurrency, name=args.name)
    stats = worker.run(stop_when_empty=args.stop_when_empty)
    app.close()
    print(json.dumps({"done": stats.done, "retried": stats.retried, "failed": stats.failed, "lost": stats.lost,
                      "reconnects": stats.reconnects}), flush=True)
    return 0


class WorkerProcess:
    """``python bench/leases.py --worker ...`` with its output in temporary files."""

    def __init__(self, dsn: str, *, concurrency: int, name: str, queues: str | None = None,
                 stop_when_empty: bool = False, lease_timeout: float = 600.0,
                 hung_lease_seconds: float | None = None):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--dsn", dsn, "--concurrency", str(concurrency),
               "--name", name, "--lease-timeout", str(lease_timeout)]
        if queues:
            cmd += ["--queues", queues]
        if stop_when_empty:
            cmd.append("--stop-when-empty")
        if hung_lease_seconds is not None:
            cmd += ["--hung-lease-seconds", str(hung_lease_seconds)]
        self.name = name
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                     cwd=REPO_ROOT)
        self.wall_s: float | None = None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"worker {self.name} did not finish within {timeout:.0f}s: {self.stderr()[-2000:]}")
        if self.wall_s is None:
            self.wall_s = time.perf_counter() - self.started
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # also ends a SIGSTOPped process
            self.proc.wait(30)

    @staticmethod
    def _read(f: Any) -> str:
        f.flush()
        f.seek(0)
        return f.read()

    def stderr(self) -> str:
        return self._read(self._err)

    def summary(self) -> dict[str, Any]:
        out = self._read(self._out).strip().splitlines()
        try:
            stats = json.loads(out[-1]) if out else None
        except json.JSONDecodeError:
            stats = None
        problems = [line for line in self.stderr().splitlines() if re.search(r"WARNING|ERROR|Traceback", line)]
        return {"name": self.name, "exit": self.proc.returncode, "wall_s": self.wall_s, "stats": stats,
                "log_problems": len(problems), "log_problem_lines": problems[:10]}


# ---- databases ------------------------------------------------------------------------------------

def connect(dsn: str, name: str = MONITOR_APP) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, application_name=name)


@contextmanager
def fresh_db(admin_dsn: str, label: str) -> Iterator[str]:
    """A new database with the skiplock schema (``App(dsn).migrate()``), dropped afterwards."""
    import psycopg
    from psycopg import conninfo, sql

    import skiplock

    name = f"bench_leases_{label}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(admin_dsn, dbname=name)
    try:
        app = skiplock.App(dsn)
        app.migrate()
        app.close()
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def enqueue(dsn: str, jobs: list[tuple[str, dict[str, Any]]], chunk: int = 10_000) -> None:
    """Through the public API, then ANALYZE and CHECKPOINT (no set-up debt in the measurement)."""
    app = make_app(dsn, hung_lease_seconds=1.0)
    try:
        for start in range(0, len(jobs), chunk):
            app.enqueue_many(jobs[start:start + chunk])
    finally:
        app.close()
    with connect(dsn) as c:
        c.execute("ANALYZE skiplock.jobs")
        try:
            c.execute("CHECKPOINT")
        except Exception:  # noqa: BLE001 - needs privileges an external server may not grant
            pass


def db_counters(c: Any) -> dict[str, Any]:
    c.execute("SELECT pg_stat_clear_snapshot()")
    row = c.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit, xact_rollback, sessions_abandoned,"
                    "       sessions_fatal, sessions_killed"
                    "  FROM pg_stat_database WHERE datname = current_database()").fetchone()
    keys = ("wal_bytes", "xact_commit", "xact_rollback", "sessions_abandoned", "sessions_fatal", "sessions_killed")
    return {k: int(v) for k, v in zip(keys, row)}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: after[k] - before[k] for k in before}


def wait_until(predicate: Any, timeout: float, what: str, every: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)
    return time.monotonic() - started


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# ---- 1. connections per in-flight job -------------------------------------------------------------

def session_sample(c: Any) -> dict[str, Any]:
    row = c.execute(
        "SELECT count(*) FILTER (WHERE w), count(*) FILTER (WHERE w AND xact_start IS NOT NULL),"
        "       count(*) FILTER (WHERE w AND state = 'idle in transaction'),"
        "       count(*) FILTER (WHERE w AND state = 'active'), count(*) FILTER (WHERE w AND backend_xid IS NOT NULL),"
        "       count(*), count(*) FILTER (WHERE xact_start IS NOT NULL), count(*) FILTER (WHERE backend_xid IS NOT NULL),"
        "       count(*) FILTER (WHERE backend_xmin IS NOT NULL)"
        "  FROM (SELECT *, application_name LIKE 'skiplock-worker%' AS w FROM pg_stat_activity"
        "         WHERE datname = current_database() AND application_name LIKE 'skiplock%') a").fetchone()
    keys = ("lease_sessions", "lease_open_xacts", "lease_idle_in_xact", "lease_active", "lease_xids",
            "skiplock_sessions", "open_xacts", "xids", "xmins")
    out: dict[str, Any] = dict(zip(keys, row))
    out["by_kind"] = dict(c.execute(
        "SELECT regexp_replace(application_name, ' .*', ''), count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'skiplock%' GROUP BY 1").fetchall())
    return out


def in_flight(c: Any, claimed: bool) -> int:
    if claimed:
        return c.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'running'").fetchone()[0]
    return c.execute("SELECT count(*) FROM skiplock.job_attempts").fetchone()[0]


def connections_once(admin_dsn: str, z: Sizes, mode: str, log: Any) -> dict[str, Any]:
    claimed = mode == "claimed"
    task = "sleep_claimed" if claimed else "sleep"
    with fresh_db(admin_dsn, f"conn_{mode}") as dsn:
        enqueue(dsn, [(task, {"seconds": z.slow_seconds})] * z.slow_jobs)
        samples: list[dict[str, Any]] = []
        with connect(dsn) as c:
            worker = WorkerProcess(dsn, concurrency=z.slow_concurrency, name=f"conn-{mode}", stop_when_empty=True)
            try:
                while worker.proc.poll() is None:
                    n = in_flight(c, claimed)
                    s = session_sample(c)
                    s["in_flight"] = n
                    s["t"] = time.perf_counter() - worker.started
                    samples.append(s)
                    time.sleep(0.1)
                worker.wait(30)
            finally:
                worker.kill()
            done = c.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'").fetchone()[0]
    full = [s for s in samples if s["in_flight"] == z.slow_jobs]
    if not full:
        raise RuntimeError(f"connections/{mode}: never saw all {z.slow_jobs} jobs in flight ({len(samples)} samples)")
    keys = ("lease_sessions", "lease_open_xacts", "lease_idle_in_xact", "lease_active", "lease_xids",
            "skiplock_sessions", "open_xacts", "xids", "xmins")
    summary = {k: statistics.median([float(s[k]) for s in full]) for k in keys}  # (full is not empty)
    ranges = {k: [min(s[k] for s in full), max(s[k] for s in full)] for k in keys}
    kinds: dict[str, list[int]] = {}
    for s in full:
        for kind, n in s["by_kind"].items():
            kinds.setdefault(kind, []).append(n)
    per_job = {k: summary[k] / z.slow_jobs for k in ("lease_sessions", "lease_open_xacts", "lease_xids",
                                                     "skiplock_sessions", "open_xacts", "xids")}
    log(f"connections/{mode}: {len(full)} samples with {z.slow_jobs} in flight: lease sessions "
        f"{summary['lease_sessions']:.0f}, in a transaction {summary['lease_open_xacts']:.0f}, holding an xid "
        f"{summary['lease_xids']:.0f}; all skiplock sessions {summary['skiplock_sessions']:.0f}")
    return {"mode": mode, "jobs": z.slow_jobs, "job_seconds": z.slow_seconds, "concurrency": z.slow_concurrency,
            "jobs_done": done, "samples": len(samples), "samples_all_in_flight": len(full),
            "median_when_all_in_flight": summary, "range_when_all_in_flight": ranges,
            "sessions_by_kind_median": {k: median([float(v) for v in vs]) for k, vs in kinds.items()},
            "per_in_flight_job": per_job, "worker": worker.summary()}


# ---- 2. throughput of no-op jobs ------------------------------------------------------------------

class ServerCpu:
    """CPU seconds of the server's process tree (live backends plus the exited ones the postmaster has
    reaped), when the server runs on this machine and we may read its processes; else None. CPU time
    is far less sensitive than wall time to other work on a shared machine."""

    def __init__(self, dsn: str):
        import psutil

        self.proc = None
        try:
            with connect(dsn) as c:
                local = c.info.host.startswith("/") or c.info.host in ("localhost", "127.0.0.1", "::1")
                pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
                parent = psutil.Process(pid).parent() if local else None
            if parent is not None and "postgres" in parent.name():
                parent.cpu_times()
                self.proc = parent
        except psutil.Error:
            self.proc = None

    def total(self) -> float | None:
        import psutil

        if self.proc is None:
            return None
        total = 0.0
        for child in self.proc.children(recursive=True):
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        t = self.proc.cpu_times()
        return total + t.user + t.system + t.children_user + t.children_system


def children_cpu() -> float:
    """CPU of this process's reaped children (each worker is waited for before it is read)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def worker_startup_cpu(admin_dsn: str, z: Sizes) -> float:
    """CPU of a worker process that finds the queue empty (imports, connections, shutdown): subtracted
    from each round's worker CPU, so the per-job figure is the jobs' own cost."""
    samples = []
    with fresh_db(admin_dsn, "startup") as dsn:
        for _ in range(2):
            before = children_cpu()
            worker = WorkerProcess(dsn, concurrency=z.noop_concurrency, name="startup", stop_when_empty=True)
            try:
                worker.wait(60)
            finally:
                worker.kill()
            samples.append(children_cpu() - before)
    return min(samples)



def throughput_once(admin_dsn: str, z: Sizes, mode: str, round_no: int, log: Any, server_cpu: ServerCpu,
                    startup_cpu: float) -> dict[str, Any]:
    task = "noop_claimed" if mode == "claimed" else "noop"
    n = z.noop_jobs
    with fresh_db(admin_dsn, f"tput_{mode}") as dsn:
        enqueue(dsn, [(task, {})] * n)
        with connect(dsn) as c:
            before = db_counters(c)
            server0, worker0 = server_cpu.total(), children_cpu()
            worker = WorkerProcess(dsn, concurrency=z.noop_concurrency, name=f"tput-{mode}", stop_when_empty=True)
            try:
                code = worker.wait(max(120.0, n / 20))
            finally:
                worker.kill()
            worker_cpu = children_cpu() - worker0
            time.sleep(1.1)  # backends flush their statistics at most once a second
            server1 = server_cpu.total()
            after = db_counters(c)
            states = dict(c.execute("SELECT state, count(*) FROM skiplock.jobs GROUP BY state").fetchall())
            span, not_once = c.execute(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8,"
                "       count(*) FILTER (WHERE attempts <> 1) FROM skiplock.jobs WHERE state = 'done'").fetchone()
    if code != 0 or states != {"done": n}:
        raise RuntimeError(f"throughput/{mode}: worker exit {code}, states {states}: {worker.stderr()[-2000:]}")
    d = delta(before, after)
    rate = n / span
    worker_us = max(0.0, worker_cpu - startup_cpu) / n * 1e6
    server_us = None if server0 is None or server1 is None else (server1 - server0) / n * 1e6
    log(f"throughput/{mode} round {round_no}: {rate:,.0f} jobs/s ({n:,} jobs in {span:.2f}s; worker wall "
        f"{worker.wall_s:.1f}s); CPU per job: worker {worker_us:.0f} us, server "
        f"{'?' if server_us is None else f'{server_us:.0f}'} us")
    return {"mode": mode, "round": round_no, "jobs": n, "concurrency": z.noop_concurrency, "span_s": span,
            "jobs_per_s": rate, "worker_wall_s": worker.wall_s, "jobs_with_attempts_not_1": not_once,
            "worker_cpu_s": worker_cpu, "worker_cpu_us_per_job": worker_us, "server_cpu_us_per_job": server_us,
            "cpu_us_per_job": None if server_us is None else worker_us + server_us,
            "commits_per_job": d["xact_commit"] / n, "wal_bytes_per_job": d["wal_bytes"] / n,
            "counters": d, "worker": worker.summary()}


# ---- 3. the hung worker ---------------------------------------------------------------------------

TUPLES_RE = re.compile(r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable")
CUTOFF_RE = re.compile(r"removable cutoff: (\d+), which was (\d+) XIDs old")
# "index scan needed/not needed: ... had N dead item identifiers removed" or "index scan bypassed: ... have N
# dead item identifiers" (too few to be worth an index pass: they stay for a later vacuum)
DEAD_ITEMS_RE = re.compile(r"(\d+) dead item identifiers( removed)?")


def vacuum_verbose(c: Any) -> dict[str, Any]:
    """``VACUUM (VERBOSE) skiplock.jobs``; what it reports about the jobs heap, and how long it took."""
    messages: list[str] = []

    def on_notice(diag: Any) -> None:
        messages.append(diag.message_primary or "")

    c.add_notice_handler(on_notice)
    t = time.perf_counter()
    try:
        c.execute("VACUUM (VERBOSE) skiplock.jobs")
    finally:
        c.remove_notice_handler(on_notice)
    seconds = time.perf_counter() - t
    out: dict[str, Any] = {"seconds": seconds}
    for m in messages:
        if '.skiplock.jobs"' in m and "finished vacuuming" in m:
            if (t_ := TUPLES_RE.search(m)):
                out.update(removed=int(t_.group(1)), remain=int(t_.group(2)), dead_not_yet_removable=int(t_.group(3)))
            if (cut := CUTOFF_RE.search(m)):
                out.update(removable_cutoff_xid=int(cut.group(1)), cutoff_xids_old=int(cut.group(2)))
            if (items := DEAD_ITEMS_RE.search(m)):
                # dead tuples already pruned to stubs (by page accesses or this vacuum) and their index entries
                key = "dead_item_identifiers_removed" if items.group(2) else "dead_item_identifiers_left"
                out[key] = int(items.group(1))
    if "removed" not in out:
        out["report"] = [m for m in messages if "skiplock.jobs" in m][:2]
    return out


def table_sample(c: Any) -> dict[str, Any]:
    c.execute("SELECT pg_stat_clear_snapshot()")
    row = c.execute(
        "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, vacuum_count, autovacuum_count,"
        "       pg_relation_size(relid), pg_indexes_size(relid), pg_total_relation_size(relid),"
        "       pg_relation_size('skiplock.jobs_claim_any_idx')"
        "  FROM pg_stat_user_tables WHERE relid = 'skiplock.jobs'::regclass").fetchone()
    keys = ("n_live_tup", "n_dead_tup", "n_tup_upd", "n_tup_hot_upd", "vacuum_count", "autovacuum_count",
            "heap_bytes", "index_bytes", "total_bytes", "claim_index_bytes")
    return dict(zip(keys, row))


def index_sizes(c: Any) -> dict[str, int]:
    return dict(c.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
                          " WHERE indrelid = 'skiplock.jobs'::regclass ORDER BY 1").fetchall())


def hung_session(c: Any) -> dict[str, Any] | None:
    row = c.execute(
        "SELECT pid, state, backend_xid::text, backend_xmin::text, age(backend_xid),"
        "       extract(epoch FROM now() - xact_start)::float8"
        "  FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'skiplock-worker hung/0'"
    ).fetchone()
    if row is None:
        return None
    return dict(zip(("pid", "state", "backend_xid", "backend_xmin", "xid_age", "xact_age_s"), row))


def horizon_holders(c: Any) -> list[dict[str, Any]]:
    """Sessions of this database holding a transaction id or a snapshot (what vacuum must respect), oldest
    first: who keeps dead rows from being removed."""
    rows = c.execute(
        "SELECT pid, application_name, state, backend_xid::text, backend_xmin::text, age(backend_xid),"
        "       age(backend_xmin), extract(epoch FROM now() - xact_start)::float8, left(query, 120)"
        "  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        "   AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
        " ORDER BY greatest(coalesce(age(backend_xid), 0), coalesce(age(backend_xmin), 0)) DESC LIMIT 5").fetchall()
    keys = ("pid", "application_name", "state", "backend_xid", "backend_xmin", "xid_age", "xmin_age", "xact_age_s",
            "query")
    return [dict(zip(keys, r)) for r in rows]


class ClaimProbe:
    """Times the workers' claim on a lease connection of its own: BEGIN; claim; ROLLBACK. Also runs the
    same claim once under EXPLAIN (ANALYZE, BUFFERS): the buffers it touches do not depend on how busy
    the machine is, so they show the claim's growing cost without the timing noise."""

    def __init__(self, dsn: str):
        import skiplock

        self.app = skiplock.App(dsn)
        self.backend: Any = cast(Any, self.app.backend)  # the PostgreSQL backend's own methods (its connections, its queries)
        self.conn = self.backend.connect_lease_connection(PROBE_APP)

    def measure(self, k: int) -> dict[str, float]:
        claim_s: list[float] = []
        total_s: list[float] = []
        for _ in range(k):
            t0 = time.perf_counter()
            self.conn.execute("SELECT 1")  # psycopg's BEGIN goes out with the first statement: take it apart
            t1 = time.perf_counter()
            self.backend.claim(self.conn, None, 1)  # every queue: the workers' claim (claim_any_queue)
            t2 = time.perf_counter()
            self.conn.rollback()
            t3 = time.perf_counter()
            claim_s.append(t2 - t1)
            total_s.append(t3 - t0)
        plan = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + self.backend.q["claim_any_queue"],
                                 {"limit": 1}).fetchone()[0][0]
        self.conn.rollback()
        top = plan["Plan"]
        return {"claim_ms": statistics.median(claim_s) * 1000, "round_trip_ms": statistics.median(total_s) * 1000,
                "claim_buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
                "claim_exec_ms_explain": plan.get("Execution Time")}

    def close(self) -> None:
        self.conn.close()
        self.app.close()


SCENARIOS = {
    # name: (hung task, lease_timeout of every App in the scenario or None for the default)
    "transaction": ("hang", None),
    "claimed": ("hang_claimed", None),
    "transaction_bounded": ("hang", "bounded"),
}


def hung_worker_once(admin_dsn: str, z: Sizes, scenario: str, log: Any) -> dict[str, Any]:
    hang_task, timeout_kind = SCENARIOS[scenario]
    lease_timeout = z.bounded_lease_timeout if timeout_kind == "bounded" else 600.0
    n = z.bloat_jobs
    result: dict[str, Any] = {"scenario": scenario, "hung_task": hang_task, "lease_timeout_s": lease_timeout,
                              "jobs": n, "concurrency": z.bloat_concurrency, "sample_every_s": z.sample_every}
    with fresh_db(admin_dsn, f"hung_{scenario}") as dsn:
        enqueue(dsn, [(hang_task, {"seconds": HANG_SECONDS})] + [("noop", {})] * n)
        c = connect(dsn)
        probe = ClaimProbe(dsn)
        hung = workers = None
        try:
            hang_id = c.execute("SELECT id FROM skiplock.jobs WHERE queue = 'hung'").fetchone()[0]
            # the table's own autovacuum settings (set by skiplock's migrations), next to the server's
            result["jobs_reloptions"] = c.execute("SELECT reloptions FROM pg_class WHERE oid = 'skiplock.jobs'::regclass"
                                                  ).fetchone()[0]
            result["before"] = {**table_sample(c), **probe.measure(KEY_PROBES)}
            counters0 = db_counters(c)
            # the hung worker: claims the one job of queue 'hung', whose handler sleeps; then frozen
            hung = WorkerProcess(dsn, concurrency=1, name="hung", queues="hung", lease_timeout=lease_timeout,
                                 hung_lease_seconds=z.hung_lease_seconds)
            if hang_task == "hang":
                def hanging() -> bool:
                    s = hung_session(c)
                    started = c.execute("SELECT count(*) FROM skiplock.job_attempts WHERE job_id = %s",
                                        [hang_id]).fetchone()[0]
                    return bool(started and s and s["backend_xid"] is not None)
            else:
                def hanging() -> bool:
                    return c.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [hang_id]).fetchone()[0] == "running"
            wait_until(hanging, 60, "the hung worker's job to start")
            hung.signal(signal.SIGSTOP)
            t_hung = time.perf_counter()
            # when the hung attempt began, on the server's clock: its transaction's start (transaction
            # lease) or the claim that marked it running (claimed lease)
            hang_began = c.execute(
                "SELECT CASE WHEN %s THEN (SELECT xact_start FROM pg_stat_activity WHERE datname = current_database()"
                "                          AND application_name = 'skiplock-worker hung/0')"
                "       ELSE (SELECT started_at FROM skiplock.jobs WHERE id = %s) END",
                [hang_task == "hang", hang_id]).fetchone()[0]
            result["hung_session_at_start"] = hung_session(c)
            result["hung_worker_sessions_at_freeze"] = [dict(zip(("pid", "application_name", "state", "xact_open"), r))
                                                         for r in c.execute(
                "SELECT pid, application_name, state, xact_start IS NOT NULL FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'skiplock%' ORDER BY pid").fetchall()]
            log(f"hung/{scenario}: worker frozen (SIGSTOP) in job {hang_id}; its session: "
                f"{result['hung_session_at_start']}")
            workers = WorkerProcess(dsn, concurrency=z.bloat_concurrency, name="w", lease_timeout=lease_timeout,
                                    hung_lease_seconds=z.hung_lease_seconds)
            t0 = workers.started
            samples: list[dict[str, Any]] = []
            drained_at = hang_done_at = session_gone_at = None
            prev_done, prev_t = 0, 0.0
            while True:
                loop_start = time.perf_counter()
                queued = c.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'queued' AND task = 'noop'"
                                   ).fetchone()[0]
                hang_state = c.execute("SELECT state FROM skiplock.jobs WHERE id = %s", [hang_id]).fetchone()[0]
                s = {"t": loop_start - t0, "done": n - queued, "hung_job_state": hang_state,
                     **table_sample(c), **probe.measure(z.probes_per_sample), "hung_session": hung_session(c),
                     "oldest_horizon_holder": next(iter(horizon_holders(c)), None)}
                s["jobs_per_s"] = (s["done"] - prev_done) / (s["t"] - prev_t) if s["t"] > prev_t else None
                prev_done, prev_t = s["done"], s["t"]
                samples.append(s)
                if s["hung_session"] is None or s["hung_session"]["backend_xid"] is None:
                    session_gone_at = session_gone_at if session_gone_at is not None else loop_start - t_hung
                if queued == 0 and drained_at is None:
                    drained_at = s["t"]
                if hang_state == "done" and hang_done_at is None:
                    hang_done_at = loop_start - t_hung
                if workers.proc.poll() is not None:
                    raise RuntimeError(f"hung/{scenario}: worker exited early: {workers.stderr()[-2000:]}")
                if drained_at is not None:
                    if scenario == "transaction" or hang_done_at is not None:
                        break
                    if s["t"] - drained_at > z.hung_job_wait_seconds:
                        break
                if s["t"] > z.drain_cap_seconds:
                    result["capped"] = True
                    break
                time.sleep(max(0.0, z.sample_every - (time.perf_counter() - loop_start)))
            workers.signal(signal.SIGTERM)
            workers.wait(60)
            time.sleep(1.1)  # statistics flush
            span = c.execute("SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8, count(*)"
                             "  FROM skiplock.jobs WHERE state = 'done' AND task = 'noop'").fetchone()
            result.update(samples=samples, drained_at_s=drained_at, noop_done=span[1],
                          drain_span_s=span[0], drain_jobs_per_s=(span[1] / span[0]) if span[0] else None,
                          after_drain={**table_sample(c), **probe.measure(KEY_PROBES)},
                          index_bytes_after_drain=index_sizes(c),
                          hung_job_done_s_after_freeze=hang_done_at,
                          hung_session_xid_released_s_after_freeze=session_gone_at,
                          hung_session_after_drain=hung_session(c))
            # VACUUM with the hung worker still there, then without it
            result["vacuum_hung_present"] = {**vacuum_verbose(c), "hung_session": hung_session(c),
                                             "horizon_holders": horizon_holders(c)}
            result["after_vacuum_hung_present"] = {**table_sample(c), **probe.measure(KEY_PROBES)}
            hung.kill()
            wait_until(lambda: hung_session(c) is None, 30, "the killed hung worker's session to end")
            result["vacuum_hung_gone"] = vacuum_verbose(c)
            time.sleep(0.2)
            result["after_vacuum_hung_gone"] = {**table_sample(c), **probe.measure(KEY_PROBES)}
            result["index_bytes_end"] = index_sizes(c)
            job = c.execute("SELECT state, attempts, last_error, extract(epoch FROM started_at - %s)::float8,"
                            "       extract(epoch FROM finished_at - %s)::float8"
                            "  FROM skiplock.jobs WHERE id = %s", [hang_began, hang_began, hang_id]).fetchone()
            redone = job[0] == "done" and job[1] > 1
            result["hung_job_end"] = {"state": job[0], "attempts": job[1],
                                      "last_error": (job[2] or "").splitlines()[0] if job[2] else None,
                                      # server clock: from the hung attempt's start to the redo's claim / finish
                                      "redo_claimed_after_s": job[3] if redone else None,
                                      "redo_finished_after_s": job[4] if redone else None}
            result["counters"] = delta(counters0, db_counters(c))
            result["workers"] = workers.summary()
            result["hung_worker"] = hung.summary()
        finally:
            for p in (hung, workers):
                if p is not None:
                    p.kill()
            probe.close()
            c.close()
    log(f"hung/{scenario}: {result['noop_done']:,} jobs at {result['drain_jobs_per_s'] or 0:,.0f} jobs/s; "
        f"n_dead_tup after drain {result['after_drain']['n_dead_tup']:,}; claim "
        f"{result['before']['claim_ms']:.2f} ms before -> {result['after_drain']['claim_ms']:.2f} ms after drain; "
        f"VACUUM (hung present) removed {result['vacuum_hung_present'].get('removed')}, not yet removable "
        f"{result['vacuum_hung_present'].get('dead_not_yet_removable')}; after kill removed "
        f"{result['vacuum_hung_gone'].get('removed')}")
    return result


# ---- the run --------------------------------------------------------------------------------------

def server_info(dsn: str) -> dict[str, Any]:
    with connect(dsn) as c:
        full = c.execute("SELECT version()").fetchone()[0]
        short = c.execute("SHOW server_version").fetchone()[0]
        settings = dict(c.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            [["autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
              "shared_buffers", "max_connections", "synchronous_commit"]]).fetchall())
    return {"server_version": short, "version": full, "settings": settings}


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "describe": git("describe", "--always", "--dirty"),
                "src_modified_files": git("status", "--porcelain", "--", "src").splitlines()}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


VACUUM_KEYS = ("removed", "dead_not_yet_removable", "cutoff_xids_old", "dead_item_identifiers_removed",
               "dead_item_identifiers_left")


def summarise(out: dict[str, Any]) -> dict[str, Any]:
    """The headline figures, each next to its same-run reference."""
    summary: dict[str, Any] = {}
    if "connections" in out:
        summary["connections_per_in_flight_job"] = {m: r["per_in_flight_job"] for m, r in out["connections"].items()}
    if "throughput" in out:
        summary["throughput_jobs_per_s"] = out["throughput"]["median_jobs_per_s"]
        summary["throughput_claimed_over_transaction"] = out["throughput"]["claimed_over_transaction"]
        summary["per_job"] = out["throughput"]["median_per_job"]
        summary["cpu_per_job_claimed_over_transaction"] = out["throughput"]["cpu_per_job_claimed_over_transaction"]
    if "hung_worker" in out:
        hung = out["hung_worker"]
        ref = hung.get("claimed")

        def vs(h: dict[str, Any], key: str) -> float | None:
            return _ratio(h["after_drain"][key], ref["after_drain"][key]) if ref else None
        summary["hung"] = {s: {
            "drain_jobs_per_s": h["drain_jobs_per_s"],
            "drain_rate_vs_claimed": _ratio(h["drain_jobs_per_s"], ref["drain_jobs_per_s"]) if ref else None,
            "n_dead_tup_after_drain": h["after_drain"]["n_dead_tup"],
            "heap_bytes_after_drain": h["after_drain"]["heap_bytes"],
            "index_bytes_after_drain": h["after_drain"]["index_bytes"],
            "heap_vs_claimed": vs(h, "heap_bytes"), "index_vs_claimed": vs(h, "index_bytes"),
            "claim_ms_before": h["before"]["claim_ms"], "claim_ms_after_drain": h["after_drain"]["claim_ms"],
            "claim_after_drain_vs_claimed": vs(h, "claim_ms"),
            "claim_buffers_before": h["before"]["claim_buffers"],
            "n_dead_tup_max_sampled": max(x["n_dead_tup"] for x in h["samples"]),
            "claim_buffers_max_sampled": max(x["claim_buffers"] for x in h["samples"]),
            "autovacuums_during_run": h["after_drain"]["autovacuum_count"] - h["before"]["autovacuum_count"],
            "claim_buffers_after_drain": h["after_drain"]["claim_buffers"],
            "vacuum_hung_present": {k: h["vacuum_hung_present"].get(k) for k in VACUUM_KEYS},
            "vacuum_hung_gone": {k: h["vacuum_hung_gone"].get(k) for k in VACUUM_KEYS},
            "claim_ms_after_vacuum": h["after_vacuum_hung_gone"]["claim_ms"],
            "claim_buffers_after_vacuum": h["after_vacuum_hung_gone"]["claim_buffers"],
            "hung_session_xid_released_s": h["hung_session_xid_released_s_after_freeze"],
            "hung_job_done_s": h["hung_job_done_s_after_freeze"],
            "hung_job_end": h["hung_job_end"]} for s, h in hung.items()}
    return summary


def run(dsn: str, quick: bool = False, log: Any = None, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Measure and return the results (see the module docstring); drops every database it creates."""
    import psycopg

    import skiplock

    z = QUICK if quick else FULL
    t_start = time.perf_counter()
    if log is None:
        def log(msg: str) -> None:
            print(f"{time.perf_counter() - t_start:6.1f}s {msg}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {
        "benchmark": "leases", "quick": quick, "sizes": asdict(z), "parts": list(parts),
        "meta": {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "psycopg": psycopg.__version__, "skiplock": skiplock.__version__, "git": git_info(),
                 "server": server_info(dsn), "load_average_start": os.getloadavg()},
    }
    log(f"leases bench{' (quick)' if quick else ''}: PostgreSQL {out['meta']['server']['server_version']}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    durations: dict[str, float] = {}
    if "connections" in parts:
        t = time.perf_counter()
        out["connections"] = {mode: connections_once(dsn, z, mode, log) for mode in ("transaction", "claimed")}
        durations["connections"] = time.perf_counter() - t
    if "throughput" in parts:
        t = time.perf_counter()
        server_cpu = ServerCpu(dsn)
        startup = worker_startup_cpu(dsn, z)
        rounds: dict[str, list[dict[str, Any]]] = {"transaction": [], "claimed": []}
        for r in range(z.throughput_rounds):
            for mode in ("transaction", "claimed"):
                rounds[mode].append(throughput_once(dsn, z, mode, r + 1, log, server_cpu, startup))
        tput = {mode: median([x["jobs_per_s"] for x in rs]) for mode, rs in rounds.items()}
        pairs = [b["jobs_per_s"] / a["jobs_per_s"] for a, b in zip(rounds["transaction"], rounds["claimed"])]
        cpu = {mode: {k: median([x[k] for x in rs if x[k] is not None]) for k in
                      ("worker_cpu_us_per_job", "server_cpu_us_per_job", "cpu_us_per_job", "commits_per_job",
                       "wal_bytes_per_job")} for mode, rs in rounds.items()}
        out["throughput"] = {"rounds": rounds, "median_jobs_per_s": tput, "claimed_over_transaction": _ratio(
            tput["claimed"], tput["transaction"]), "claimed_over_transaction_per_round": pairs,
            "worker_startup_cpu_s": startup, "median_per_job": cpu,
            "cpu_per_job_claimed_over_transaction": _ratio(cpu["claimed"]["cpu_us_per_job"],
                                                           cpu["transaction"]["cpu_us_per_job"])}
        durations["throughput"] = time.perf_counter() - t
    if "hung" in parts:
        out["hung_worker"] = {}
        for s in SCENARIOS:
            t = time.perf_counter()
            out["hung_worker"][s] = hung_worker_once(dsn, z, s, log)
            durations[f"hung_{s}"] = time.perf_counter() - t
    out["summary"] = summarise(out)
    out["meta"].update(duration_s=time.perf_counter() - t_start, durations_s=durations,
                       load_average_end=os.getloadavg())
    log(f"done in {out['meta']['duration_s']:.0f}s")
    return out


def start_server(data_dir: str | None) -> tuple[str, Any]:
    """(admin DSN, cleanup) for the embedded server in ``data_dir``, or a throw-away one."""
    try:  # this file also runs as a script (no package): the module of either layout
        from skiplock.backend.postgres import embedded
    except ImportError:  # a revision from before the embedded server moved below the backend
        from skiplock import embedded  # type: ignore[no-redef]
    if data_dir:
        return embedded.ensure_server(Path(data_dir).expanduser().resolve()).dsn, lambda: None
    tmp = Path(tempfile.mkdtemp(prefix="skiplock-bench-leases-"))
    server = embedded.ensure_server(tmp / "pg")

    def cleanup() -> None:
        embedded.stop_server(tmp / "pg", mode="fast")
        embedded.remove_data_dir(tmp)
    return server.dsn, cleanup


def print_summary(r: dict[str, Any]) -> None:
    s = r["summary"]
    print(f"leases bench{' (quick)' if r['quick'] else ''}: {r['meta']['cpu_count']} CPUs, PostgreSQL "
          f"{r['meta']['server']['server_version']}, {r['meta']['duration_s']:.0f}s")
    for mode, per in s.get("connections_per_in_flight_job", {}).items():
        print(f"  connections/{mode}: per in-flight job: lease sessions {per['lease_sessions']:.2f}, "
              f"open transactions {per['lease_open_xacts']:.2f} (all skiplock: sessions {per['skiplock_sessions']:.2f}, "
              f"open xacts {per['open_xacts']:.2f}, xids {per['xids']:.2f})")
    if "throughput_jobs_per_s" in s:
        t = s["throughput_jobs_per_s"]
        print(f"  throughput: transaction {t['transaction']:,.0f} jobs/s, claimed {t['claimed']:,.0f} jobs/s, "
              f"claimed/transaction {s['throughput_claimed_over_transaction']:.2f}; CPU per job (worker + server): "
              + ", ".join(f"{m} {v['cpu_us_per_job'] or 0:.0f} us" for m, v in s["per_job"].items())
              + f", claimed/transaction {s['cpu_per_job_claimed_over_transaction'] or 0:.2f}")
    for name, h in s.get("hung", {}).items():
        print(f"  hung/{name}: drain {h['drain_jobs_per_s'] or 0:,.0f} jobs/s (x{h['drain_rate_vs_claimed'] or 0:.2f} of "
              f"claimed), n_dead_tup {h['n_dead_tup_after_drain']:,}, heap {h['heap_bytes_after_drain'] / 2**20:.1f} MiB, "
              f"indexes {h['index_bytes_after_drain'] / 2**20:.1f} MiB, claim {h['claim_ms_before']:.2f} -> "
              f"{h['claim_ms_after_drain']:.2f} ms ({h['claim_buffers_before']} -> {h['claim_buffers_after_drain']} "
              f"buffers), VACUUM with hung worker {h['vacuum_hung_present']}, after it was killed "
              f"{h['vacuum_hung_gone']}, claim then {h['claim_ms_after_vacuum']:.2f} ms "
              f"({h['claim_buffers_after_vacuum']} buffers)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--dsn", default=os.environ.get("SKIPLOCK_DSN"),
                   help="an existing server (a database per scenario is created on it)")
    p.add_argument("--data-dir", help="embedded server data directory (left running) [default: a fresh temporary one]")
    p.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output path [bench/results/leases.json]")
    p.add_argument("--only", help=f"comma-separated parts to run: {', '.join(PARTS)} [all]")
    # the worker process (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--name", default="w", help=argparse.SUPPRESS)
    p.add_argument("--queues", help=argparse.SUPPRESS)
    p.add_argument("--stop-when-empty", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lease-timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--hung-lease-seconds", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)
    cleanup = lambda: None  # noqa: E731
    if args.dsn:
        dsn = args.dsn
    else:
        dsn, cleanup = start_server(args.data_dir)
    try:
        parts = tuple(x.strip() for x in args.only.split(",")) if args.only else PARTS
        unknown = [x for x in parts if x not in PARTS]
        if unknown:
            raise SystemExit(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
        result = run(dsn, quick=args.quick, parts=parts)
    finally:
        cleanup()
    result["meta"]["command"] = " ".join(["python", "-m", "bench.leases", *(argv if argv is not None else sys.argv[1:])])
    result["meta"]["server_kind"] = "external (--dsn)" if args.dsn else "embedded"
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_summary(result)
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
