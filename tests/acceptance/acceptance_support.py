"""Helpers for the acceptance tests: run the real ``skiplock`` CLI and worker processes, and poll the
database for conditions with a deadline (never a fixed sleep standing in for an assertion)."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import psycopg
from support import ChildProcess, cli_argv, wait_for, kill_all  # noqa: F401 - re-exported for the tests
from support import cli_env as _cli_env
from support import run_cli as _run_cli


HERE = Path(__file__).resolve().parent
APP = "tasks_app:app"
# Safety nets only: a hung process fails the test instead of hanging the suite.
CLI_TIMEOUT = 60


def cli_env() -> dict[str, str]:
    return _cli_env(HERE)


def run_cli(dsn: str, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run one CLI command to completion (the timeout is only a safety net)."""
    return _run_cli(dsn, *args, cwd=HERE, timeout=timeout)


@dataclass
class WorkerProc(ChildProcess):
    proc: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    kind = "worker"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr()


class Spawner:
    """Starts worker processes for one test and makes sure none outlives it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[WorkerProc] = []

    def worker(self, dsn: str, *args: str, concurrency: int = 1, poll_interval: float = 0.05,
               app: str = APP, stop_when_empty: bool = False) -> WorkerProc:
        n = len(self.procs)
        out, err = self.tmp / f"worker{n}.out", self.tmp / f"worker{n}.err"
        argv = cli_argv(dsn, "worker", "--app", app, "--concurrency", str(concurrency),
                        "--poll-interval", str(poll_interval), *args)
        if stop_when_empty:
            argv.append("--stop-when-empty")
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(argv, cwd=HERE, env=cli_env(), stdin=subprocess.DEVNULL, stdout=fo, stderr=fe)
        wp = WorkerProc(proc, out, err)
        self.procs.append(wp)
        return wp

    def cleanup(self) -> None:
        kill_all(self.procs)


def scalar(db: psycopg.Connection[Any], query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
    row = db.execute(query, params).fetchone()
    return None if row is None else row[0]


def job_row(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    row = cur.execute("SELECT * FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row


def in_flight(db: psycopg.Connection[Any], worker: WorkerProc) -> dict[int, str]:
    """Jobs in a transaction of ``worker`` that has not committed: {job id: "alone"} for an attempt
    counted on its own (its row in job_attempts), {job id: "batch"} for the jobs of a batch (its row
    in job_batches lists them all, run yet or not)."""
    rows = db.execute("SELECT job_id, 'alone' FROM skiplock.job_attempts WHERE worker LIKE %(w)s "
                      "UNION ALL SELECT unnest(ids), 'batch' FROM skiplock.job_batches WHERE worker LIKE %(w)s",
                      {"w": worker.slot_pattern}).fetchall()
    return {job_id: kind for job_id, kind in sorted(rows, key=lambda r: r[1])}  # "batch" wins if both


def effects_of(db: psycopg.Connection[Any], job_id: int) -> list[tuple[int, int]]:
    """(attempt, pid) of every committed effect of a job."""
    return [tuple(r) for r in db.execute("SELECT attempt, pid FROM effects WHERE job_id = %s ORDER BY id",
                                         [job_id]).fetchall()]


def crash_a_batch_until_done(dsn: str, producer: Any, spawn: Any, concurrency: int) -> tuple[list[int], int, list[int]]:
    """A poison job (``crash_if`` with crash, max_attempts 2) between 20 + 20 good ones, run by fresh
    workers with batches of 16 until one exits cleanly (at most 6). Returns the workers' exit codes,
    the poison job's id and the good jobs' ids."""
    before = producer.enqueue_many([("crash_if", {})] * 20)  # the claim size ramps to 16 (1+2+4+8+...)
    poison = producer.enqueue("crash_if", {"crash": True}, max_attempts=2)
    after = producer.enqueue_many([("crash_if", {})] * 20)
    codes: list[int] = []
    for _ in range(6):
        w = spawn.worker(dsn, "--batch-size", "16", "--batch-budget", "60", concurrency=concurrency,
                         stop_when_empty=True)
        codes.append(w.wait(timeout=60))
        if codes[-1] == 0:
            break
    return codes, poison, before + after
