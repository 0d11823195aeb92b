"""Fixtures for the flow-control tests: the ``flow_runs`` table the tasks of flow_app.py record
their runs in, and real ``skiplock worker`` processes on the test database (killed at the end)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from support import ChildProcess, cli_argv, cli_env, kill_all

HERE = Path(__file__).resolve().parent


@dataclass
class Worker(ChildProcess):
    proc: subprocess.Popen[bytes]
    log: Path
    kind = "worker"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Spawner:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[Worker] = []

    def worker(self, dsn: str, *, concurrency: int, lease: str = "transaction", queues: tuple[str, ...] = (),
               env: dict[str, str] | None = None, options: tuple[str, ...] = ()) -> Worker:
        log = self.tmp / f"worker{len(self.procs)}.log"
        argv = cli_argv(dsn, "worker", "--app", "flow_app:app", "--concurrency", str(concurrency),
                        "--poll-interval", "0.05", "--fixed-concurrency",
                        *(["--queues", ",".join(queues)] if queues else []), *options)
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=HERE, env=cli_env(HERE, FLOW_LEASE=lease, **(env or {})),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        w = Worker(proc, log)
        self.procs.append(w)
        return w

    def cleanup(self) -> None:
        kill_all(self.procs)


@pytest.fixture
def runs(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    db.execute("CREATE TABLE flow_runs (job_id bigint NOT NULL, part text NOT NULL, started timestamptz NOT NULL, "
               "ended timestamptz NOT NULL, pid int NOT NULL, "
               # the recording transaction: the job's lease transaction (a batch's jobs share one)
               "xact bigint NOT NULL DEFAULT txid_current())")
    return db


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path)
    yield s
    s.cleanup()
