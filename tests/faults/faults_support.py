"""Helpers for the fault-injection suite: its own PostgreSQL server (which the tests stop and restart),
real CLI worker processes, a TCP proxy that can stall, the invariant checks every scenario ends with,
and the per-scenario figures printed at the end of the run.

Never a fixed sleep standing in for an assertion: conditions are polled with deadlines. The only
timing asserted is a stated behaviour bound (how soon a partitioned job is back), never speed.
"""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import psycopg
from psycopg import conninfo

from skiplock.backend.postgres import embedded
from support import ChildProcess, cli_argv, wait_for, kill_all  # noqa: F401 - re-exported for the tests
from support import cli_env as _cli_env
from support import run_cli as _run_cli

HERE = Path(__file__).resolve().parent
APP = "faults_tasks:app"
CLI_TIMEOUT = 60  # safety nets only: a hung process fails the test instead of hanging the suite

# ---- the suite's own server -------------------------------------------------------------------------


class FaultServer:
    """An embedded PostgreSQL owned by the fault suite, so stopping and restarting it never disturbs
    the server the rest of the test suite shares. It always comes back on the same port and socket
    (``pg_ctl restart`` reuses the command line in postmaster.opts; ``start`` is given it again).
    It listens on 127.0.0.1 too (asked for: the embedded default is the Unix socket only), for the
    TCP proxy and the network-namespace partitions."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.server = embedded.ensure_server(data_dir, tcp=True)
        self.port = self.server.port
        self.socket_dir = self.server.socket_dir
        self.log = data_dir / "server.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return conninfo.make_conninfo(self.server.dsn, dbname=dbname)

    def tcp_dsn(self, dbname: str = "postgres", port: int | None = None) -> str:
        return conninfo.make_conninfo(self.server.tcp_dsn, dbname=dbname, port=str(port or self.port))

    def running(self) -> bool:
        return embedded._read_running(self.data_dir) is not None

    def _pg_ctl(self, *args: str) -> None:
        # -l: a server started by pg_ctl without a log file keeps pg_ctl's stdout, a pipe here, open.
        self.server.pg_ctl("-w", "-t", "60", *args, timeout=90)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def start(self, options: str = "") -> None:
        """Start it on its port and socket; ``options`` adds server options (``-c name=value``)."""
        self._pg_ctl("-l", str(self.log), "-o", f"-p {self.port} -k {self.socket_dir} {options}".strip(), "start")
        self._reread()

    def restart(self, mode: str) -> None:
        self._pg_ctl("-m", mode, "-l", str(self.log), "restart")
        self._reread()

    def _reread(self) -> None:
        """The new postmaster (pid) from postmaster.pid; it must be on the same port and socket."""
        running = wait_for(lambda: embedded._read_running(self.data_dir), 30, "the restarted server to be ready")
        assert (running.port, running.socket_dir) == (self.port, self.socket_dir), running
        self.server = running

    def ensure_running(self) -> None:
        if not self.running():
            self.start()

    def remove(self) -> None:
        if self.running():
            self.stop("immediate")
        embedded.remove_data_dir(self.data_dir)


# ---- processes --------------------------------------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    return _cli_env(HERE, **extra)


def run_cli(dsn: str, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return _run_cli(dsn, *args, cwd=HERE, timeout=timeout)


@dataclass
class WorkerProc(ChildProcess):
    proc: subprocess.Popen[bytes]
    log_path: Path
    kind = "worker"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 4000) -> str:
        """The log's tail; a live worker then writes every thread's stack (SIGUSR1), so a timed-out
        wait says what the worker was waiting for."""
        text = f"--- worker {self.pid} log (tail) ---\n{self.output()[-n:]}"
        if self.alive() and "serving" in self.output():  # its handlers are installed
            size = len(self.output())
            self.signal(signal.SIGUSR1)
            time.sleep(0.5)
            text += f"\n--- its threads ---\n{self.output()[size:]}"
        return text


class Workers:
    """Starts real ``skiplock worker`` processes for one test; none outlives it."""

    def __init__(self, tmp: Path, exec_dir: Path):
        self.tmp = tmp
        self.exec_dir = exec_dir
        self.procs: list[WorkerProc] = []

    def start(self, dsn: str, *, concurrency: int = 2, poll_interval: float = 0.05, env: dict[str, str] | None = None,
              preexec_fn: Callable[[], None] | None = None, extra: Sequence[str] = (),
              prefix: Sequence[str] = ()) -> WorkerProc:
        """``prefix``: a command that execs the worker in place (same pid), e.g. ``ip netns exec NS``."""
        log_path = self.tmp / f"worker{len(self.procs)}.log"
        argv = [*prefix, *cli_argv(dsn, "worker", "--app", APP, "--concurrency", str(concurrency),
                        "--poll-interval", str(poll_interval), *extra)]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=HERE, env=cli_env(FAULTS_EXEC_DIR=str(self.exec_dir), **(env or {})),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=preexec_fn)
        wp = WorkerProc(proc, log_path)
        self.procs.append(wp)
        return wp

    def stop_all(self, procs: Iterable[WorkerProc], db: psycopg.Connection[Any]) -> dict[int, int]:
        """SIGTERM (finish in-flight jobs, exit) and wait; returns {pid: exit code}. Waits first for each
        to be serving (a process SIGTERMed before it installs its handlers just dies of it)."""
        procs = list(procs)
        for wp in procs:
            wait_ready(db, wp)
        for wp in procs:
            if wp.alive():
                wp.signal(signal.SIGTERM)
        return {wp.pid: wp.wait() for wp in procs}

    def cleanup(self) -> None:
        kill_all(self.procs)


def serving_pids(db: psycopg.Connection[Any]) -> set[int]:
    """Worker processes whose slots are connected (from their lease sessions' application_name)."""
    rows = db.execute("SELECT DISTINCT substring(application_name from ':([0-9]+)/') FROM pg_stat_activity "
                      "WHERE application_name LIKE 'skiplock-worker %%'").fetchall()
    return {int(r[0]) for r in rows if r[0]}


def wait_ready(db: psycopg.Connection[Any], wp: WorkerProc, timeout: float = 30) -> None:
    """Until ``wp``'s slots have connected (its signal handlers are installed before that)."""
    wait_for(lambda: not wp.alive() or scalar(
        db, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
        [f"skiplock-worker {wp.slot_pattern}"]) > 0, timeout, f"worker {wp.pid} to serve", on_timeout=wp.tail)
    assert wp.alive(), f"worker {wp.pid} exited at start\n{wp.tail()}"


# ---- a TCP proxy that can stall -----------------------------------------------------------------------


class StallProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target>, one pair of pump threads per connection.

    ``stall()`` stops forwarding in both directions while every socket stays open, as a network
    partition does; ``heal()`` resumes. Limitation (stated, not hidden): this proxy's own kernel still
    ACKs the bytes each side sends and answers TCP keepalive probes, so neither the server's keepalives
    nor ``tcp_user_timeout`` can notice this partition; what bounds it is skiplock's lease transaction
    bound (idle_in_transaction_session_timeout / transaction_timeout = ``lease_timeout``) and, for the
    claimed lease, lease expiry plus the rescuer.
    """

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0
        threading.Thread(target=self._accept, name="stall-proxy-accept", daemon=True).start()

    def stall(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
                self.connections += 1
            pair_done = threading.Event()
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, pair_done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair_done: threading.Event) -> None:
        try:
            while not self._closed.is_set() and not pair_done.is_set():
                if not self._flowing.wait(0.1):
                    continue  # stalled: read nothing, send nothing, keep both sockets open
                readable, _, _ = select.select([src], [], [], 0.1)
                if not readable or not self._flowing.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            pair_done.set()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---- a real network path that can be cut ---------------------------------------------------------------


class NetnsLink:
    """A network namespace joined to the host by a veth pair (needs root and iproute2).

    A worker run inside the namespace reaches the server over a real TCP path through the kernel;
    ``cut()`` takes the host end of the link down, so packets in both directions are dropped and
    nothing answers: no ACK, no RST, no keepalive reply -- what a dead host or a partition looks like
    to the server. Names and the /30 subnet derive from ``tag`` so concurrent runs do not collide.
    """

    def __init__(self, tag: int):
        tag %= 1 << 14  # 256 x 64 subnets of 4 addresses in 10.213.0.0/16
        self.ns = f"skf{tag}"
        self.host_if, self.ns_if = f"skf{tag}h", f"skf{tag}n"
        third, fourth = tag // 64, (tag % 64) * 4
        self.host_ip, self.ns_ip = f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}"
        self.exec_prefix = ["ip", "netns", "exec", self.ns]

    @staticmethod
    def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def up(self) -> None:
        self._ip("netns", "add", self.ns)
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self._ip("link", "set", self.ns_if, "netns", self.ns)
        self._ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self._ip("netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
        self._ip("netns", "exec", self.ns, "ip", "link", "set", "lo", "up")

    def cut(self) -> None:
        self._ip("link", "set", self.host_if, "down")

    def remove(self) -> None:
        self._ip("link", "del", self.host_if, check=False)
        self._ip("netns", "del", self.ns, check=False)


# ---- invariants ---------------------------------------------------------------------------------------


def executions(exec_dir: Path) -> list[tuple[int, int, int]]:
    """Every handler start recorded by faults_tasks: (job_id, attempt, pid)."""
    out = []
    for path in exec_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 3:
                out.append((int(fields[0]), int(fields[1]), int(fields[2])))
    return out


def scalar(db: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = db.execute(query, params).fetchone()
    return None if row is None else row[0]


def unfinished(db: psycopg.Connection[Any], ids: Sequence[int]) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state NOT IN ('done', 'failed')",
                  [list(ids)])


def states_of(db: psycopg.Connection[Any], ids: Sequence[int]) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.jobs WHERE id = ANY(%s) GROUP BY state",
                           [list(ids)]).fetchall())


@dataclass
class Verdict:
    """What happened to a set of jobs, from the database and the execution logs."""

    jobs: int
    states: dict[str, int]
    lost: list[int]  # missing, or not done/failed at the end
    finished_twice: list[int]  # more than one committed database-local effect
    done_without_effect: list[int]
    failed_with_effect: list[int]
    failed_without_reason: list[int]
    executions: int  # handler runs recorded
    reexecuted_jobs: int  # jobs whose handler ran more than once (at-least-once, visible externally)
    duplicated_executions: int  # handler runs beyond each job's first
    leftovers: dict[str, int] = field(default_factory=dict)  # bookkeeping rows left behind

    def problems(self) -> list[str]:
        out = []
        for name in ("lost", "finished_twice", "done_without_effect", "failed_with_effect", "failed_without_reason"):
            value = getattr(self, name)
            if value:
                out.append(f"{name}: {len(value)} job(s), e.g. {value[:10]}")
        for name, n in self.leftovers.items():
            if n:
                out.append(f"{name}: {n} row(s) left behind")
        return out


def verdict(db: psycopg.Connection[Any], ids: Sequence[int], exec_dir: Path, *,
            effect_expected: bool = True) -> Verdict:
    """Check the suite's invariants for ``ids``: none lost (each exists and is done or failed), none
    finished twice (at most one committed effect), a done job has exactly one effect (if its task
    always writes one), a failed job has none and says why, and no bookkeeping is left behind."""
    ids = list(ids)
    rows = {r[0]: (r[1], r[2]) for r in db.execute(
        "SELECT id, state, last_error FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall()}
    effects = Counter(dict(db.execute(
        "SELECT job_id, count(*) FROM effects WHERE job_id = ANY(%s) GROUP BY job_id", [ids]).fetchall()))
    wanted = set(ids)
    runs = Counter(job_id for job_id, _, _ in executions(exec_dir) if job_id in wanted)
    lost = [i for i in ids if i not in rows or rows[i][0] not in ("done", "failed")]
    v = Verdict(
        jobs=len(ids),
        states=dict(Counter(state for state, _ in rows.values())),
        lost=lost,
        finished_twice=[i for i in ids if effects[i] > 1],
        done_without_effect=[i for i in ids if effect_expected and rows.get(i, ("",))[0] == "done" and effects[i] != 1],
        failed_with_effect=[i for i in ids if rows.get(i, ("",))[0] == "failed" and effects[i] > 0],
        failed_without_reason=[i for i in ids if rows.get(i, ("",))[0] == "failed" and not (rows[i][1] or "").strip()],
        executions=sum(runs.values()),
        reexecuted_jobs=sum(1 for n in runs.values() if n > 1),
        duplicated_executions=sum(n - 1 for n in runs.values()),
        leftovers={
            "job_attempts": scalar(db, "SELECT count(*) FROM skiplock.job_attempts WHERE job_id = ANY(%s)", [ids]),
            "running": scalar(db, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'running'", [ids]),
        },
    )
    return v


# ---- the summary printed at the end of the run ---------------------------------------------------------


@dataclass
class Figures:
    scenario: str
    mode: str  # "transaction", "claimed"
    jobs: int
    faults: str  # e.g. "20 SIGKILL"
    lost: int
    finished_twice: int  # jobs done more than once (a committed effect more than once)
    reexecuted: int  # extra handler runs beyond the first (external effects are at least once)
    failed: int  # jobs that ended failed (each with its reason)
    seconds: float
    note: str = ""


SUMMARY: list[Figures] = []


def record(scenario: str, mode: str, v: Verdict, faults: str, seconds: float, note: str = "") -> None:
    SUMMARY.append(Figures(scenario, mode, v.jobs, faults, len(v.lost), len(v.finished_twice),
                           v.duplicated_executions, v.states.get("failed", 0), round(seconds, 1), note))
