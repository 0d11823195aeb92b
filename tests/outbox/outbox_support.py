"""Helpers for the outbox tests: poll with a deadline (never a fixed sleep standing in for an assertion), and
run real relay processes through the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from skiplock.retry import Constant
from support import ChildProcess, wait_for, kill_all  # noqa: F401 - re-exported for the tests

FAST_RETRY = Constant(0.05)  # retries due almost at once, so a retry test takes milliseconds


def deliveries_by_message(receiver) -> dict[int, int]:
    """How many times the receiver got each message id."""
    out: dict[int, int] = {}
    for d in receiver.deliveries():
        out[d.message_id] = out.get(d.message_id, 0) + 1
    return out


def states(db) -> dict[str, int]:
    return {s: n for s, n in db.execute("SELECT state, count(*) FROM skiplock.outbox GROUP BY state").fetchall()}


def all_sent(db, n: int) -> bool:
    return states(db).get("sent", 0) == n


def row(db, message_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM skiplock.outbox WHERE id = %s", [message_id])
    names = [d.name for d in cur.description]
    values = cur.fetchone()
    assert values is not None, f"message {message_id} does not exist"
    return dict(zip(names, values))


# ---- relay processes (the real CLI) -----------------------------------------------------------------



class RelayProc(ChildProcess):
    kind = "relay"

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc, self.log = proc, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class RelaySpawner:
    """Starts ``python -m skiplock relay`` processes; any still running at the end of the test is killed."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[RelayProc] = []

    def relay(self, dsn: str, *args: str) -> RelayProc:
        log = self.tmp / f"relay{len(self.procs)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
        env["PYTHONUNBUFFERED"] = "1"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "--dsn", dsn, "relay", *args],
                                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        rp = RelayProc(proc, log)
        self.procs.append(rp)
        return rp

    def cleanup(self) -> None:
        kill_all(self.procs)
