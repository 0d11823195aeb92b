"""`skiplock demo`: worker processes drain jobs, one is SIGKILLed mid-job, and nothing is lost or doubled.

What it shows: every job ends done; each job's database-local effect (a row written through
``job.conn`` in the job's transaction) exists exactly once; the job the killed worker had in flight
was rolled back by the server and redone by another worker. What it does not show: external
effects (an email) -- those are at-least-once and need the receiver to deduplicate.

On PostgreSQL and on MySQL/MariaDB alike: the demo's own SQL (its reads, the slots, the database)
is the DSN's dialect's (tools/dialect.py); the queue, the workers and the handler are the same code.

Runs at once: each demo takes a *slot* -- a session advisory lock (MySQL: a named lock) on the server, held on an open
connection until the demo ends (or its process dies) -- and uses that slot's own database
(``skiplock_demo``, ``skiplock_demo_2``, ...). It recreates only its own slot's database, so two
demos against one server never drop each other's database; when every slot is taken it says so
and runs nothing. The database stays afterwards for inspection (the demo prints how).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from types import ModuleType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..app import App
from .dialect import for_dsn

DEMO_DB = "skiplock_demo"
# How many demos may run at once against one server (each in its own database).
DEMO_SLOTS = 8


class DemoBusy(Exception):
    """Every demo slot of the server is taken by a running demo."""

app = App()


@app.task(name="demo.record_effect", max_attempts=5)
def record_effect(job: Any, n: int) -> None:
    """The database-local effect: one row per run that commits, written in the job's transaction."""
    # a DB-API cursor with %s placeholders: the same handler on psycopg and on PyMySQL
    with job.conn.cursor() as cur:
        cur.execute("INSERT INTO demo_effects (job_id, n, worker_pid) VALUES (%s, %s, %s)", (job.id, n, os.getpid()))
    time.sleep(0.002)  # a little work, so that a worker is killed while a job is in flight


def demo_database(slot: int) -> str:
    return DEMO_DB if slot == 1 else f"{DEMO_DB}_{slot}"


def take_slot(admin_dsn: str) -> tuple[Any, int]:
    """The first free demo slot, locked on the returned connection (keep it open while the demo runs:
    closing it, or the process dying, frees the slot). Raises :class:`DemoBusy` if none is free.
    PostgreSQL: a session advisory lock; MySQL/MariaDB: a named lock (GET_LOCK) -- tools/*_dialect.py."""
    dialect = for_dsn(admin_dsn)
    lock = dialect.Db(admin_dsn)
    for slot in range(1, DEMO_SLOTS + 1):
        if dialect.try_slot(lock, slot):
            return lock, slot
    lock.close()
    raise DemoBusy(f"{DEMO_SLOTS} skiplock demos are already running against this server; wait for one to finish")


def _start_worker(dsn: str, concurrency: int) -> subprocess.Popen[bytes]:
    """A ``skiplock worker`` process. The DSN goes through its environment (``SKIPLOCK_DSN``), never its
    command line: any local user can read another process's argv (/proc/PID/cmdline, ``ps``), only the
    process's owner its environment. The schema is the demo's own (the default), whatever
    ``SKIPLOCK_SCHEMA`` says."""
    env = {k: v for k, v in os.environ.items() if k != "SKIPLOCK_SCHEMA"}
    env["SKIPLOCK_DSN"] = dsn
    return subprocess.Popen(
        [sys.executable, "-m", "skiplock", "--quiet", "worker", "--app", "skiplock.tools.demo:app",
         "--concurrency", str(concurrency), "--poll-interval", "0.05", "--log-level", "ERROR"],
        stdin=subprocess.DEVNULL, env=env,
    )


def run_demo(admin_dsn: str, *, jobs: int = 10_000, workers: int = 4, concurrency: int = 2,
             console: Console | None = None) -> bool:
    """Run the demo in a free slot's database and say afterwards how to look at it. Raises
    :class:`DemoBusy` when every slot is taken."""
    console = console or Console()
    lock, slot = take_slot(admin_dsn)
    try:
        database = demo_database(slot)
        if slot > 1:
            console.print(f"another demo is running against this server; this one uses database {database!r}",
                          markup=False)
        dialect = for_dsn(admin_dsn)
        dsn = dialect.prepare_database(admin_dsn, database)
        ok = _run(dialect, dsn, database, jobs=jobs, workers=workers, concurrency=concurrency, console=console)
        _say_how_to_inspect(dialect, dsn, database, console)
        return ok
    finally:
        lock.close()


def _say_how_to_inspect(dialect: ModuleType, dsn: str, database: str, console: Console) -> None:
    from ..errors import redact_dsn

    shown = redact_dsn(dsn)
    has_password = dialect.has_password(dsn)
    console.print(f"The demo's jobs are in database {database!r} ({shown}); it stays until the next demo in that "
                  "database. Look at them with:", markup=False, soft_wrap=True)
    target = f"--dsn '{shown}'" if not has_password else f"--dsn '{dialect.dsn_hint(database)}'"
    for command in ("status", "jobs --state done --limit 5", "jobs --json --limit 1"):
        console.print(f"  skiplock {target} {command}", markup=False, soft_wrap=True)


def _run(dialect: ModuleType, dsn: str, database: str, *, jobs: int, workers: int, concurrency: int, console: Console) -> bool:
    demo_app = App(dsn)
    demo_app.migrate()
    t0 = time.monotonic()
    demo_app.enqueue_many([("demo.record_effect", {"n": i}) for i in range(jobs)])
    console.print(f"enqueued {jobs:,} jobs in one round trip ({time.monotonic() - t0:.2f}s) into database {database!r}")
    procs = [_start_worker(dsn, concurrency) for _ in range(workers)]
    console.print(f"started {workers} worker processes x {concurrency} slots: pids {', '.join(str(p.pid) for p in procs)}")
    victim = procs[0]
    killed_in_flight: list[int] = []
    start = time.monotonic()
    try:
        with dialect.Db(dsn) as db, Progress(
            TextColumn("[bold]draining"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
        ) as progress:
            bar = progress.add_task("jobs", total=jobs)
            done = 0
            deadline = start + 300
            while done < jobs and time.monotonic() < deadline:
                done = int(db.one(dialect.DONE)[0])
                progress.update(bar, completed=done)
                if victim.poll() is None and done >= jobs // 3 and not killed_in_flight:
                    killed_in_flight = _kill_with_jobs_in_flight(dialect, db, victim)
                    if killed_in_flight:
                        what = (f"{_ids(killed_in_flight)}" if len(killed_in_flight) > 6 else
                                f"job(s) {_ids(killed_in_flight)}")
                        progress.console.print(f"[bold red]SIGKILL[/] worker {victim.pid} with {what} in flight")
                time.sleep(0.05 if killed_in_flight or done < jobs // 3 else 0.002)
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return _report(dialect, dsn, jobs, victim.pid, killed_in_flight, elapsed, console)


def _kill_with_jobs_in_flight(dialect: ModuleType, db: Any, victim: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL ``victim`` if it has jobs in flight, and return them ([] and no kill if it has none).

    The victim is frozen first (SIGSTOP): a stopped process sends nothing, so once the server has
    processed what it already sent (its sessions are no longer active) its open transactions cannot
    change. The jobs of those transactions are the attempts (a job run alone) and, on PostgreSQL,
    batches naming it (the dialect's ``jobs_in_flight``); those and only those roll back with the kill.
    It is frozen only once a look without stopping it saw jobs in flight: freezing it at every look
    (about 0.1 s each, a few ms apart) starved it on a loaded machine, so that the other workers
    drained the queue before a look found it between a claim and a commit ("none seen")."""
    if not dialect.jobs_in_flight(db, victim.pid):
        return []
    victim.send_signal(signal.SIGSTOP)
    for _ in range(2):  # again after a pause: a message still in a socket buffer may arrive late
        deadline = time.monotonic() + 5
        while dialect.active_sessions(db, victim.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
    in_flight: list[int] = dialect.jobs_in_flight(db, victim.pid)
    if not in_flight:
        victim.send_signal(signal.SIGCONT)
        return []
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return in_flight


def _ids(ids: list[int]) -> str:
    """A short form of a list of job ids: all of a few, else how many and the range."""
    if len(ids) <= 6:
        return ", ".join(map(str, ids))
    return f"{len(ids)} jobs, {min(ids)}…{max(ids)}"


def _redone(rows: list[tuple[int, int, int]]) -> str:
    if len(rows) <= 6:
        return "; ".join(f"job {i}: attempt {a} by pid {p}" for i, a, p in rows)
    attempts = sorted({a for _, a, _ in rows})
    pids = sorted({p for _, _, p in rows})
    return (f"{len(rows)} jobs, attempt {'/'.join(map(str, attempts))}, by pid(s) {', '.join(map(str, pids))}"
            " (a job killed in a batch is not charged: it runs again alone)")


def _report(dialect: ModuleType, dsn: str, jobs: int, victim_pid: int, in_flight: list[int], elapsed: float,
            console: Console) -> bool:
    with dialect.Db(dsn) as db:
        r = dialect.report_rows(db, in_flight, victim_pid)
    done, failed, other, effects, distinct_jobs, doubled, redone, victim_effects_for_inflight = (
        r["done"], r["failed"], r["other"], r["effects"], r["distinct_jobs"], r["doubled"], r["redone"],
        r["victim_effects"])
    checks = [
        ("jobs enqueued", f"{jobs:,}", True),
        ("jobs done", f"{done:,}", done == jobs),
        ("jobs failed / not finished", f"{failed} / {other}", failed == 0 and other == 0),
        ("effect rows (one per committed job)", f"{effects:,}", effects == jobs),
        ("jobs whose effect exists more than once", str(doubled), doubled == 0),
        ("jobs without an effect", f"{jobs - distinct_jobs:,}", distinct_jobs == jobs),
        (f"killed worker {victim_pid}: jobs in flight", _ids(in_flight) or "none seen", bool(in_flight)),
        ("...their effects left by the killed worker", str(victim_effects_for_inflight), victim_effects_for_inflight == 0),
        ("...redone by another worker (attempt, pid)",
         _redone(redone) or "-",
         len(redone) == len(in_flight) and all(p != victim_pid for _, a, p in redone)),
        ("wall time / throughput", f"{elapsed:.1f}s / {jobs / elapsed:,.0f} jobs/s", True),
    ]
    table = Table(title="skiplock demo: the transaction is the lease")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("ok")
    for name, value, ok in checks:
        table.add_row(name, value, "[green]yes[/]" if ok else "[bold red]NO[/]")
    console.print(table)
    ok = all(c[2] for c in checks)
    console.print("[bold green]every job done, every database-local effect exactly once[/]" if ok
                  else "[bold red]a check failed (see above)[/]")
    return ok
