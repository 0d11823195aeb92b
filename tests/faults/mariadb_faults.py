"""The MariaDB fault tests' shared part (test_fault_mariadb*.py): the suite's own private MariaDB
10.11 (module-scoped: the restart test stops it, so never the session's shared server), a test's
database on it with the invariants of :func:`faults_support.verdict` read from MariaDB, and real
``skiplock worker`` processes whose DSN (with its password) goes through ``SKIPLOCK_DSN``, never argv.
The test modules import the fixtures ``maria``, ``mdb`` and ``producer`` from here."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

import faults_tasks
from faults_support import HERE, APP, Verdict, WorkerProc, cli_env, executions, kill_all, wait_for
from mariadb_server import MariaDB, drop_database, fresh_database, start

EFFECTS_DDL = ("CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, "
               "attempt INT NOT NULL, pid INT NOT NULL, lease VARCHAR(16) NOT NULL, KEY (job_id)) ENGINE=InnoDB")


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDB]:
    """The fault suite's own MariaDB (the restart test stops it: never the session's shared one)."""
    server = start()
    try:
        yield server
    finally:
        server.stop()


class Db:
    """A test's database on the fault server: DSNs, a query helper that reconnects each time (the
    server may have been restarted), and the workers (killed at the end)."""

    def __init__(self, server: MariaDB, tmp: Path):
        self.server, self.tmp = server, tmp
        self.name = fresh_database(server)
        self.exec_dir = tmp / "exec"
        self.exec_dir.mkdir()
        self.procs: list[WorkerProc] = []

    def dsn(self, port: int | None = None) -> str:
        dsn = "mariadb://" + self.server.dsn(self.name)[len("mysql://"):]
        return dsn if port is None else dsn.replace(f":{self.server.port}/", f":{port}/")

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.server.connect(self.name, connect_timeout=5) as c, c.cursor() as cur:
            cur.execute(query, params)
            return [tuple(r) for r in cur.fetchall()]

    def scalar(self, query: str, params: Any = None) -> Any:
        found = self.rows(query, params)
        return found[0][0] if found else None

    def worker(self, *, concurrency: int = 2, port: int | None = None, env: dict[str, str] | None = None,
               extra: Sequence[str] = (), maintenance: bool = False) -> WorkerProc:
        """A ``skiplock worker`` process; ``maintenance`` runs its rescuer (every FAULTS_RESCUE_INTERVAL,
        0.5 s: it returns expired claimed leases), scheduler and pruner."""
        log_path = self.tmp / f"worker{len(self.procs)}.log"
        argv = [sys.executable, "-m", "skiplock", "--quiet", "worker", "--app", APP, "--concurrency",
                str(concurrency), "--poll-interval", "0.05", *([] if maintenance else ["--no-maintenance"]), *extra]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=HERE, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=cli_env(FAULTS_EXEC_DIR=str(self.exec_dir), SKIPLOCK_DSN=self.dsn(port),
                                                **(env or {})))
        wp = WorkerProc(proc, log_path)
        self.procs.append(wp)
        return wp

    def serving(self, wp: WorkerProc, timeout: float = 30) -> None:
        """Until ``wp`` is registered in the workers table (its run has begun: signal handlers installed)."""
        def registered() -> bool:
            try:
                return bool(self.scalar("SELECT COUNT(*) FROM skiplock_workers WHERE pid = %s", (wp.pid,)))
            except Exception:  # noqa: BLE001 - the server is restarting
                return False
        wait_for(lambda: not wp.alive() or registered(), timeout, f"worker {wp.pid} to serve", on_timeout=wp.tail)
        assert wp.alive(), f"worker {wp.pid} exited at start\n{wp.tail()}"

    def stop(self, procs: Sequence[WorkerProc]) -> dict[int, int]:
        for wp in procs:
            self.serving(wp)
            wp.signal(signal.SIGTERM)
        return {wp.pid: wp.wait() for wp in procs}

    def ids_in(self, ids: Sequence[int]) -> str:
        return ",".join(str(int(i)) for i in ids) or "-1"  # ints only: safe to inline

    def unfinished(self, ids: Sequence[int]) -> int:
        return int(self.scalar(f"SELECT COUNT(*) FROM skiplock_jobs WHERE id IN ({self.ids_in(ids)}) "
                               "AND state NOT IN ('done', 'failed')"))

    def states(self, ids: Sequence[int]) -> dict[str, int]:
        return dict(self.rows(f"SELECT state, COUNT(*) FROM skiplock_jobs WHERE id IN ({self.ids_in(ids)}) "
                              "GROUP BY state"))

    def verdict(self, ids: Sequence[int]) -> Verdict:
        """faults_support.verdict's invariants, read from MariaDB."""
        ids = list(ids)
        inl = self.ids_in(ids)
        rows = {r[0]: (r[1], r[2]) for r in self.rows(f"SELECT id, state, last_error FROM skiplock_jobs WHERE id IN ({inl})")}
        effects = Counter({r[0]: int(r[1]) for r in self.rows(
            f"SELECT job_id, COUNT(*) FROM effects WHERE job_id IN ({inl}) GROUP BY job_id")})
        wanted = set(ids)
        runs = Counter(j for j, _, _ in executions(self.exec_dir) if j in wanted)
        state = lambda i: rows.get(i, ("",))[0]  # noqa: E731
        return Verdict(
            jobs=len(ids), states=dict(Counter(s for s, _ in rows.values())),
            lost=[i for i in ids if state(i) not in ("done", "failed")],
            finished_twice=[i for i in ids if effects[i] > 1],
            done_without_effect=[i for i in ids if state(i) == "done" and effects[i] != 1],
            failed_with_effect=[i for i in ids if state(i) == "failed" and effects[i] > 0],
            failed_without_reason=[i for i in ids if state(i) == "failed" and not (rows[i][1] or "").strip()],
            executions=sum(runs.values()), reexecuted_jobs=sum(1 for n in runs.values() if n > 1),
            duplicated_executions=sum(n - 1 for n in runs.values()),
            leftovers={"job_attempts": int(self.scalar(f"SELECT COUNT(*) FROM skiplock_job_attempts WHERE job_id IN ({inl})")),
                       "running": int(self.scalar(f"SELECT COUNT(*) FROM skiplock_jobs WHERE id IN ({inl}) "
                                                  "AND state = 'running'"))})

    def job_errors(self, job_id: int) -> tuple[str, str, list[dict[str, Any]]]:
        """(state, last_error, errors) of a job, errors parsed (a JSON column)."""
        state, last_error, errors = self.rows("SELECT state, last_error, errors FROM skiplock_jobs WHERE id = %s",
                                              (job_id,))[0]
        return state, last_error or "", json.loads(errors or "[]")

    def close(self) -> None:
        kill_all(self.procs)
        if self.server.process.poll() is not None:
            self.server.resume()
        drop_database(self.server, self.name)


@pytest.fixture
def mdb(maria: MariaDB, tmp_path: Path) -> Iterator[Db]:
    if maria.process.poll() is not None:  # a failed test may have left it stopped
        maria.resume()
    d = Db(maria, tmp_path)
    d.rows(EFFECTS_DDL)
    yield d
    d.close()


@pytest.fixture
def producer(mdb: Db) -> Iterator[faults_tasks.FaultsApp]:
    app = faults_tasks.build_app(mdb.dsn())
    app.migrate()
    yield app
    app.close()
