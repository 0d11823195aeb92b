"""Shared pieces of the benchmark scenarios: the server, fresh databases, CPU accounting, worker processes, figures.

CPU accounting, and why it is done this way:
- Worker CPU is the rusage of each worker process, collected with ``os.wait4`` when it exits (so it
  covers every thread of the process, start-up included; scenarios subtract the start-up cost measured
  on an empty queue where it matters).
- Server CPU is the CPU of one postmaster's process tree: the user+system time of every live child
  plus the postmaster's own time and its ``children_*`` time (the CPU of backends that already exited,
  which the postmaster has reaped). A difference of two such snapshots therefore counts backends that
  came and went in between. Other PostgreSQL servers on the machine (other people's tests) are not
  counted; other databases on *this* server are, so the bench uses a server of its own by default.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import psutil
import psycopg
from psycopg import conninfo, sql

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---- the code under test -----------------------------------------------------------------------


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> tuple[Any, ...]:
    """The single row a query returns (an error if none)."""
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    if row is None:
        raise RuntimeError(f"no row from {query[:60]!r}")
    return tuple(row)


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def export_revision(rev: str) -> tuple[dict[str, Any], str]:
    """Export src/ of ``rev`` (``git archive``) into a new temporary directory: (what it is, the path
    of its src/ -- for a worker's ``PYTHONPATH``)."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    target = Path(tempfile.mkdtemp(prefix=f"skiplock-bench-{commit[:8]}-"))
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "src"], cwd=REPO_ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return ({"commit": commit, "describe": git("describe", "--always", commit), "source": f"git archive {rev}",
             "src_modified_files": [], "export_dir": str(target)}, str(target / "src"))


def use_revision(rev: str) -> dict[str, Any]:
    """Export src/ of ``rev`` and put it first on the import path of this process and of every worker."""
    info, src = export_revision(rev)
    sys.path.insert(0, src)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH", "")] if p)
    return info



# ---- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    """The PostgreSQL server under test: an admin DSN, where pgbench is, and (if local) its postmaster."""

    dsn: str
    bin_dir: Path
    postmaster_pid: int | None
    embedded_data_dir: Path | None = None
    owns_server: bool = False  # started by this run: stop and delete it at the end
    _cleanup_dir: Path | None = None

    @property
    def pgbench(self) -> Path:
        return self.bin_dir / "pgbench"

    def version(self) -> dict[str, Any]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            full = one(c, "SELECT version()")[0]
            short = one(c, "SHOW server_version")[0]
            settings: dict[str, str] = dict(c.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                [["shared_buffers", "max_connections", "synchronous_commit", "fsync", "wal_sync_method",
                  "autovacuum_naptime", "max_wal_size", "checkpoint_timeout"]]).fetchall())
        return {"server_version": short, "version": full, "settings": settings}

    def close(self) -> None:
        if self.owns_server and self.embedded_data_dir is not None:
            embedded = embedded_module()

            embedded.stop_server(self.embedded_data_dir, mode="fast")
            if self._cleanup_dir is not None:
                embedded.remove_data_dir(self._cleanup_dir)



def embedded_module() -> Any:
    """skiplock's embedded-server module, wherever the benchmarked revision has it (``--rev`` may
    export an older src/): ``skiplock.backend.postgres.embedded``, formerly ``skiplock.embedded``."""
    import importlib

    try:
        return importlib.import_module("skiplock.backend.postgres.embedded")
    except ModuleNotFoundError:
        return importlib.import_module("skiplock.embedded")

# Applied to a server the bench starts for itself (never to one given with --dsn or --data-dir).
# A drained queue leaves one dead index entry per job at the head of the claim index; every claim
# steps over them until autovacuum runs. With the embedded default naptime (10 s) whether that
# happens inside a 10-second measurement is luck, and figures then swing by 2-3x; at 1 s it is not.
OWNED_SERVER_SETTINGS = {"autovacuum_naptime": "1s"}


def start_embedded(data_dir: str | None, max_connections: int | None = None) -> Server:
    """The embedded server in ``data_dir`` (started if needed, left running), or a fresh throw-away
    one in a temporary directory (stopped and deleted at the end) when ``data_dir`` is None; a
    throw-away one gets ``max_connections`` if given (one restart, before anything is measured)."""
    embedded = embedded_module()

    cleanup: Path | None = None
    if data_dir is None:
        cleanup = Path(tempfile.mkdtemp(prefix="skiplock-bench-"))
        path = cleanup / "pg"
    else:
        path = Path(data_dir).expanduser().resolve()
    server = embedded.ensure_server(path)
    if cleanup is not None:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            for name, value in OWNED_SERVER_SETTINGS.items():
                c.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            c.execute("SELECT pg_reload_conf()")
            if max_connections is not None:
                c.execute(sql.SQL("ALTER SYSTEM SET max_connections = {}").format(sql.Literal(max_connections)))
        if max_connections is not None:
            embedded.stop_server(path, mode="fast")
            server = embedded.ensure_server(path)
    return Server(dsn=server.dsn, bin_dir=server.bin_dir, postmaster_pid=server.pid, embedded_data_dir=path,
                  owns_server=cleanup is not None, _cleanup_dir=cleanup)


def from_dsn(dsn: str) -> Server:
    """An existing server. Its postmaster is found through our own backend's parent process when the
    server runs on this machine (server CPU is reported as unknown otherwise)."""
    _bin_dir = embedded_module()._bin_dir

    with psycopg.connect(dsn, autocommit=True) as c:
        backend_pid = one(c, "SELECT pg_backend_pid()")[0]
        host = c.info.host
    postmaster: int | None = None
    if host.startswith("/") or host in ("localhost", "127.0.0.1", "::1"):
        try:
            parent = psutil.Process(backend_pid).parent()
            if parent is not None and "postgres" in parent.name():
                postmaster = parent.pid
        except psutil.Error:
            postmaster = None
    return Server(dsn=dsn, bin_dir=_bin_dir(), postmaster_pid=postmaster)


def with_db(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


@contextmanager
def fresh_db(server: Server, label: str, migrate: bool = True) -> Iterator[str]:
    """A new database for one scenario (skiplock schema installed unless ``migrate=False``), dropped after."""
    name = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_db(server.dsn, name)
    try:
        if migrate:
            import skiplock

            app = skiplock.App(dsn)
            app.migrate()
            app.close()
        yield dsn
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def dbname_of(dsn: str) -> str:
    return str(conninfo.conninfo_to_dict(dsn)["dbname"])


def settle(dsn: str, timeout: float = 10.0) -> None:
    """Wait until no other session is connected to this database (the scenario's backends have exited,
    so their CPU is in the postmaster's reaped-children time and their statistics are flushed)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while time.monotonic() < deadline:
            n = one(c, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")[0]
            if n == 0:
                break
            time.sleep(0.02)
    time.sleep(0.1)  # the postmaster reaps exited backends asynchronously


def table_stats(dsn: str, table: str = "skiplock.jobs") -> dict[str, Any]:
    """Dead tuples and (auto)vacuum activity of a table: a queue's throughput depends on them."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        row = c.execute(
            "SELECT n_live_tup, n_dead_tup, vacuum_count, autovacuum_count, analyze_count, autoanalyze_count,"
            "       pg_relation_size(relid), pg_indexes_size(relid)"
            "  FROM pg_stat_user_tables WHERE relid = %s::regclass", [table]).fetchone()  # None: no such table
    keys = ("live_tuples", "dead_tuples", "vacuums", "autovacuums", "analyzes", "autoanalyzes", "table_bytes",
            "index_bytes")
    return dict(zip(keys, row)) if row else {}


def checkpoint(dsn: str) -> None:
    """Start measurements from a clean slate: no checkpoint debt from the set-up's writes."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CHECKPOINT")


# ---- counters -----------------------------------------------------------------------------------


class ServerCpu:
    """CPU seconds used by one postmaster's process tree (see the module docstring)."""

    def __init__(self, postmaster_pid: int | None):
        self.proc: psutil.Process | None = None
        if postmaster_pid is not None:
            try:
                self.proc = psutil.Process(postmaster_pid)
                self.proc.cpu_times()
            except psutil.Error:
                self.proc = None

    def total(self) -> float | None:
        if self.proc is None:
            return None
        children = 0.0
        for child in self.proc.children(recursive=True):
            try:
                t = child.cpu_times()
                children += t.user + t.system
            except psutil.Error:
                pass
        t = self.proc.cpu_times()
        return children + t.user + t.system + t.children_user + t.children_system


class MachineLoad:
    """CPU used on the whole machine vs by this benchmark (this process, its children, the server):
    the difference is other people's work, which makes every figure of the run noisier."""

    def __init__(self, server_cpu: ServerCpu):
        self.server_cpu = server_cpu
        self.start = self._read()

    def _read(self) -> tuple[float, float, float]:
        t = psutil.cpu_times()
        busy = t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
        me = psutil.Process().cpu_times()
        ours = me.user + me.system + me.children_user + me.children_system
        return time.monotonic(), busy, (self.server_cpu.total() or 0.0) + ours

    def other_cores(self) -> float | None:
        """Average number of cores busy with work not ours since construction."""
        end = self._read()
        if self.server_cpu.proc is None:
            return None
        seconds = end[0] - self.start[0]
        return max(0.0, ((end[1] - self.start[1]) - (end[2] - self.start[2])) / seconds) if seconds > 0 else None


@dataclass
class DbCounters:
    """Server-wide WAL position and this database's transaction/deadlock counters."""

    wal_lsn: int
    xact_commit: int
    xact_rollback: int
    deadlocks: int
    server_cpu: float | None
    at: float

    @classmethod
    def read(cls, dsn: str, cpu: ServerCpu) -> "DbCounters":
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT pg_stat_force_next_flush()")
            c.execute("SELECT pg_stat_clear_snapshot()")
            lsn = one(c, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0]
            commit, rollback, deadlocks = one(
                c, "SELECT xact_commit, xact_rollback, deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cls(int(lsn), commit, rollback, deadlocks, cpu.total(), time.perf_counter())

    def delta(self, later: "DbCounters") -> dict[str, Any]:
        """Differences; ``server_cpu_s`` is None when the server's processes are not visible."""
        return {
            "wal_bytes": later.wal_lsn - self.wal_lsn,
            # minus the few transactions of the reads themselves
            "xact_commit": later.xact_commit - self.xact_commit,
            "xact_rollback": later.xact_rollback - self.xact_rollback,
            "deadlocks": later.deadlocks - self.deadlocks,
            "server_cpu_s": None if self.server_cpu is None or later.server_cpu is None
            else later.server_cpu - self.server_cpu,
            "seconds": later.at - self.at,
        }


# ---- processes ----------------------------------------------------------------------------------


@dataclass
class Finished:
    returncode: int
    cpu_s: float  # user + system of the process, all threads
    user_s: float
    sys_s: float
    wall_s: float
    stdout: str
    stderr: str


class Child:
    """A subprocess whose exact CPU use we collect with ``os.wait4`` (no shared RUSAGE_CHILDREN)."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | str | None = None):
        self.cmd = list(cmd)
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                      env=env, cwd=cwd)
        self.pid = self.popen.pid
        self.result: Finished | None = None

    def cpu_now(self) -> float:
        """CPU so far of the running process (for windows inside a long-running worker)."""
        t = psutil.Process(self.pid).cpu_times()
        return t.user + t.system

    def poll(self) -> Finished | None:
        if self.result is None:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
            if pid != 0:
                self._finish(status, ru)
        return self.result

    def wait(self, timeout: float) -> Finished:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{' '.join(self.cmd[:6])} ... did not finish within {timeout:.0f}s:\n"
                                   f"{self._read(self._err)[-2000:]}")
            time.sleep(0.005)
        assert self.result is not None
        return self.result

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.result is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.result is None:
            _, status, ru = os.wait4(self.pid, 0)
            self._finish(status, ru)

    def _finish(self, status: int, ru: Any) -> None:
        wall = time.perf_counter() - self.started
        code = os.waitstatus_to_exitcode(status)
        self.popen.returncode = code  # we reaped it; tell Popen so it does not try again
        self.result = Finished(code, ru.ru_utime + ru.ru_stime, ru.ru_utime, ru.ru_stime, wall, self._read(self._out),
                               self._read(self._err))

    @staticmethod
    def _read(f: Any) -> str:
        f.flush()
        f.seek(0)
        return f.read()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("SKIPLOCK_DSN", None)
    return env


def spawn_worker(dsn: str, concurrency: int, *, stop_when_empty: bool = True, poll_interval: float | None = None,
                 options: dict[str, Any] | None = None, log_level: str | None = None, wrapper: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> Child:
    """A worker process serving ``bench.tasks:app``: through the public command line, or, when
    ``options`` (keyword arguments for ``app.worker``) are given, through ``bench.worker``; ``env``
    adds variables to its environment (e.g. ``bench.tasks.RETENTION_ENV``). ``log_level``: the
    worker's ``--log-level`` (default ``BENCH_WORKER_LOG_LEVEL``, else INFO: the CLI's default, a
    line per finished job)."""
    if log_level is None:
        log_level = os.environ.get("BENCH_WORKER_LOG_LEVEL", "INFO")
    if options:
        cmd = [*wrapper, sys.executable, "-m", "bench.worker", "--dsn", dsn, "--concurrency", str(concurrency),
               "--log-level", log_level, *(f"--option={k}={json.dumps(v)}" for k, v in options.items())]
    else:
        cmd = [*wrapper, sys.executable, "-m", "skiplock", "--dsn", dsn, "-q", "worker", "--app", "bench.tasks:app",
               "--concurrency", str(concurrency), "--log-level", log_level]
    if stop_when_empty:
        cmd.append("--stop-when-empty")
    if poll_interval is not None:
        cmd += ["--poll-interval", str(poll_interval)]
    return Child(cmd, env={**python_env(), **(env or {})}, cwd=REPO_ROOT)


STOPPED_LINE = re.compile(r"stopped: (\d+) done, (\d+) retried, (\d+) failed")
PROBLEM_LINE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback|deadlock", re.I)


def worker_summary(stderr: str) -> dict[str, Any]:
    """What a worker's log says: its final counts, and any line that reports a problem."""
    m = STOPPED_LINE.search(stderr)
    problems = [line for line in stderr.splitlines() if PROBLEM_LINE.search(line)]
    return {"done": int(m.group(1)) if m else None, "retried": int(m.group(2)) if m else None,
            "failed": int(m.group(3)) if m else None, "problem_lines": problems[:20], "problems": len(problems)}


def wait_for_sessions(dsn: str, application_prefix: str, count: int, timeout: float = 30.0) -> None:
    """Until ``count`` sessions whose application_name starts with the prefix are connected here."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while True:
            n = one(c, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name LIKE %s", [application_prefix + "%"])[0]
            if n >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {n} of {count} {application_prefix!r} sessions connected after {timeout}s")
            time.sleep(0.05)


def wait_for_workers(dsn: str, processes: int, timeout: float = 60.0) -> None:
    """Until every one of ``processes`` workers has its row in the workers table and has refreshed it
    since the last of them started: each has then counted all the others (the presence loop's count,
    which sets its share of leases, ``Governor.share``). Not their sessions: a worker opens a slot's
    session only once the slot may hold a lease, so most slots of several processes never open one."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while True:
            rows, seen_all = one(c, "SELECT count(*), coalesce(bool_and(last_seen > (SELECT max(started_at) "
                                    "FROM skiplock.workers)), false) FROM skiplock.workers")
            if rows >= processes and seen_all:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{rows} of {processes} workers registered and settled after {timeout:.0f}s")
            time.sleep(0.05)
    time.sleep(0.2)  # the last refresh's count reaches its governor just after the write


# ---- statistics and figures ---------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    s = sorted(values)
    if not s:
        raise ValueError("no values")
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
            "max": max(ms), "mean": statistics.fmean(ms)}


_GOAL = re.compile(r"^\s*(>=|<=|==)\s*([-+0-9.eE]+)\s*$")


@dataclass
class Figure:
    """One reported number, with what it is compared to.

    ``ratio`` is always ``value / baseline_or_target``; ``goal`` is a condition on the ratio (or, when
    ``goal_on == "value"``, on the value itself, e.g. ``== 0`` deadlocks). A figure without a goal is
    informational. ``baseline_key`` names a reference measured elsewhere in the run, resolved at the end
    (so a baseline measured twice can be averaged)."""

    scenario: str
    name: str
    value: float | None
    unit: str
    baseline_or_target: float | None = None
    reference: str = ""
    goal: str | None = None
    goal_on: str = "ratio"
    baseline_key: str | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def resolve(self, refs: dict[str, float]) -> None:
        if self.baseline_key is not None and self.baseline_or_target is None:
            self.baseline_or_target = refs.get(self.baseline_key)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline_or_target:
            return None
        return self.value / self.baseline_or_target

    @property
    def target_met(self) -> bool | None:
        if self.goal is None:
            return None
        subject = self.value if self.goal_on == "value" else self.ratio
        if subject is None:
            return False
        m = _GOAL.match(self.goal)
        if not m:
            raise ValueError(f"bad goal {self.goal!r}")
        op, bound = m.group(1), float(m.group(2))
        return {">=": subject >= bound, "<=": subject <= bound, "==": subject == bound}[op]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "value": self.value, "unit": self.unit,
            "baseline_or_target": self.baseline_or_target, "ratio": self.ratio, "target_met": self.target_met,
            "scenario": self.scenario, "reference": self.reference,
            "goal": None if self.goal is None else f"{'value' if self.goal_on == 'value' else 'ratio'} {self.goal}",
        }
        if self.note:
            out["note"] = self.note
        if self.details:
            out["details"] = self.details
        return out


def per_job_us(total_s: float | None, jobs: int) -> float | None:
    return None if total_s is None or jobs <= 0 else total_s / jobs * 1e6


# ---- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does; ``QUICK`` is a smoke run, ``FULL`` the issue's figures."""

    baseline_tx: int = 20_000          # pgbench transactions (rows claimed), 16 clients
    batched_rows: int = 100_000        # pgbench's batched ceiling: rows claimed per client count (bench/baseline.py)
    drain_jobs: int = 20_000
    latency_rate: float = 200.0        # jobs per second, one at a time
    latency_seconds: float = 10.0
    latency_idle_seconds: float = 3.0  # idle window before the jobs, to show the cost of polling
    enqueue_many: int = 100_000
    enqueue_single: int = 2_000
    insert_pgbench_seconds: float = 3.0
    backlog_small: int = 10_000
    backlog_large: int = 1_000_000
    backlog_claims: int = 20_000
    backlog_warmup: int = 1_000
    backlog_max_seconds: float = 30.0  # per backlog: cap on the measured window
    many_jobs: int = 100_000
    many_processes: int = 8
    many_concurrency: int = 8
    outage_seconds: tuple[float, ...] = (5.0, 17.0, 60.0)  # outage scenario: how long the server is down
    load_capacity_jobs: int = 10_000   # load scenario: prefilled 1 ms jobs drained to measure capacity
    load_seconds: float = 12.0         # load scenario: measured window of offered load
    load_warmup_seconds: float = 2.0   # load scenario: offered load before the window (not measured)
    sweep_rounds: int = 3              # sweep: every cell this many times, interleaved; figures are medians


FULL = Sizes()
QUICK = Sizes(baseline_tx=4_000, batched_rows=20_000, drain_jobs=4_000, latency_seconds=2.0, latency_idle_seconds=1.0,
              enqueue_many=20_000, enqueue_single=300, insert_pgbench_seconds=1.0, backlog_large=100_000,
              backlog_claims=2_000, backlog_warmup=200, backlog_max_seconds=6.0, many_jobs=4_000,
              outage_seconds=(2.0, 5.0), load_capacity_jobs=3_000, load_seconds=3.0, load_warmup_seconds=0.5,
              sweep_rounds=1)


@dataclass
class Context:
    server: Server
    sizes: Sizes
    drain_concurrency: list[int]
    latency_concurrency: int
    worker_options: dict[str, Any] = field(default_factory=dict)  # app.worker(**options) for every worker
    refs: dict[str, float] = field(default_factory=dict)     # reference values other figures divide by
    raw: dict[str, Any] = field(default_factory=dict)        # per-scenario details for the JSON
    log: Any = print

    def cpu(self) -> ServerCpu:
        return ServerCpu(self.server.postmaster_pid)

    def worker(self, dsn: str, concurrency: int, **kwargs: Any) -> Child:
        return spawn_worker(dsn, concurrency, options=self.worker_options, **kwargs)
