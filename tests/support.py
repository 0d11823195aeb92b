"""Helpers shared by the test folders: polling with a deadline, running the real CLI, and a named
statement's text for PREPARE (the plan tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "a condition", interval: float = 0.02,
             on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail after ``timeout``.
    The deadline is a safety net for a hung system, never an assertion about speed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}{extra}")
        time.sleep(interval)


def cli_env(importable: Path, **extra: str) -> dict[str, str]:
    """The environment for CLI subprocesses: no SKIPLOCK_* from outside, ``importable`` on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(importable), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"  # rich tables: no column truncation in captured output
    env.update(extra)
    return env


def cli_argv(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "skiplock", "--quiet", "--dsn", dsn, *args]


def run_cli(dsn: str, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one CLI command to completion (the timeout is only a safety net)."""
    return subprocess.run(cli_argv(dsn, *args), cwd=cwd, env=cli_env(cwd), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


class ChildProcess:
    """A CLI child process (worker or relay) a test drives with signals. Subclasses hold ``proc`` and
    say where its log is (``output``)."""

    kind = "process"
    proc: subprocess.Popen[bytes]

    def output(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def slot_pattern(self) -> str:
        """LIKE pattern matching this process's worker slot names (``host:pid/slot``, as in jobs.worker)."""
        return f"%:{self.proc.pid}/%"

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 30) -> int:
        """The exit code; fails the test (with the log's tail) if it does not exit in ``timeout``."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.kind} {self.pid} did not exit within {timeout}s; its log (tail):\n"
                                 f"{self.output()[-4000:]}") from None


def kill_all(procs: Sequence[ChildProcess]) -> None:
    """SIGKILL every child still running (continued first, in case a test stopped it), then reap them."""
    for p in procs:
        if p.alive():
            try:
                p.proc.send_signal(signal.SIGCONT)
                p.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def positional(statement: str) -> tuple[str, list[str]]:
    """``statement`` (psycopg's ``%(name)s`` / ``%(name)b`` placeholders) with ``$n`` ones, for
    ``PREPARE``, and the names in ``$n`` order: a plan test then runs ``EXPLAIN EXECUTE`` of it, the
    plan a prepared statement runs (an EXPLAIN sent with bound values is planned for those values,
    whatever ``plan_cache_mode`` says)."""
    names: list[str] = []

    def number(match: "re.Match[str]") -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sb]", number, statement).replace("%%", "%"), names


# The two plans a prepared statement can run: the generic one a worker's session keeps, and one made
# for the values at hand (a plan test checks both).
PLANS = ["force_generic_plan", "force_custom_plan"]


def plan(dsn: str, query: str, values: dict[str, Any], analyze: bool = False,
         mode: str = "force_generic_plan", warm: bool = False) -> Any:
    """The plan of ``query`` as a prepared statement runs it under ``mode``: PREPARE, then EXPLAIN
    EXECUTE with the values. (An EXPLAIN sent with bound parameters is planned for those values
    whatever plan_cache_mode says: it never showed the generic plan, which a worker's claims keep.)
    ``warm``: run it once first, in the same transaction, so that the buffers counted are the
    statement's own, not the session's first look-ups in the catalogs (a worker's session made them
    long ago)."""
    import psycopg
    from psycopg import sql

    text, names = positional(query)
    with psycopg.connect(dsn) as c:
        c.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Identifier(mode)))
        c.execute("PREPARE claim AS " + text)
        options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
        args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
        explain = sql.SQL("EXPLAIN ({}) EXECUTE claim{}").format(
            sql.SQL(options), sql.SQL("({})").format(args) if names else sql.SQL(""))
        if warm:
            c.execute(explain)
        rows = c.execute(explain).fetchone()[0]  # type: ignore[index]
        c.rollback()
    return rows[0]["Plan"]


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and every node under it, depth first."""
    out = [node]
    for child in node.get("Plans", []):
        out += nodes(child)
    return out


def job_scans(root: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's scans of the jobs table."""
    return [n for n in nodes(root) if n.get("Relation Name") == "jobs"]


def scan_reads(scans: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each scan's node type, index, index condition, rows, loops and buffers (hit + read): what a
    failing bound on a plan's buffers prints, so the node that read them is known."""
    return [(n["Node Type"], n.get("Index Name"), n.get("Index Cond"), n.get("Actual Rows"), n.get("Actual Loops"),
             n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)) for n in scans]


# A flow claim's parameters (queries.sql `claim_flow*`): task "t" limited to 2 at a time per customer,
# no key held back; ``extra`` replaces any of them.
FLOW_LIMITS = {"lt_tasks": ["t"], "lt_concurrency": [2], "lt_partition_by": ["customer"], "lt_every": [None]}


def flow_claim_params(**extra: Any) -> dict[str, Any]:
    base = {"queues": None, "tasks": ["t"], "held_queues": [], "held_tasks": [], "held": [], "queue": None, "limit": 32,
            "after": None, **FLOW_LIMITS}
    base.update(extra)
    return base
