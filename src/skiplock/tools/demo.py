"""`skiplock demo`: worker processes drain jobs, one is SIGKILLed mid-job, and nothing is lost or doubled.

What it shows: every job ends done; each job's database-local effect (a row written through
``job.conn`` in the job's transaction) exists exactly once; the job the killed worker had in flight
was rolled back by the server and redone by another worker. What it does not show: external
effects (an email) -- those are at-least-once and need the receiver to deduplicate.

Runs at once: each demo takes a *slot* -- a session advisory lock on the server, held on an open
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

import psycopg
from psycopg import conninfo, sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..app import App
from ..backend.postgres.connections import connect, row_of

DEMO_DB = "skiplock_demo"
# How many demos may run at once against one server (each in its own database).
DEMO_SLOTS = 8
# The advisory lock keys of the slots: (DEMO_LOCK_CLASS, slot number) -- two int4 keys.
DEMO_LOCK_CLASS = 0x736B6C  # "skl"


class DemoBusy(Exception):
    """Every demo slot of the server is taken by a running demo."""

app = App()


@app.task(name="demo.record_effect", max_attempts=5)
def record_effect(job: Any, n: int) -> None:
    """The database-local effect: one row per run that commits, written in the job's transaction."""
    job.conn.execute("INSERT INTO demo_effects (job_id, n, worker_pid) VALUES (%s, %s, %s)", [job.id, n, os.getpid()])
    time.sleep(0.002)  # a little work, so that a worker is killed while a job is in flight


def demo_database(slot: int) -> str:
    return DEMO_DB if slot == 1 else f"{DEMO_DB}_{slot}"


def take_slot(admin_dsn: str) -> tuple[psycopg.Connection[Any], int]:
    """The first free demo slot, locked on the returned connection (keep it open while the demo runs:
    closing it, or the process dying, frees the slot). Raises :class:`DemoBusy` if none is free."""
    lock = connect(admin_dsn, autocommit=True)  # connect: a clear error, without the password
    for slot in range(1, DEMO_SLOTS + 1):
        if row_of(lock.execute("SELECT pg_try_advisory_lock(%s, %s)", [DEMO_LOCK_CLASS, slot]))[0]:
            return lock, slot
    lock.close()
    raise DemoBusy(f"{DEMO_SLOTS} skiplock demos are already running against this server; wait for one to finish")


def _prepare_database(admin_dsn: str, database: str = DEMO_DB) -> str:
    """(Re)create ``database`` -- the caller holds its slot, so no other demo uses it."""
    with connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    dsn = conninfo.make_conninfo(admin_dsn, dbname=database)
    with connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE demo_effects (id bigint GENERATED ALWAYS AS IDENTITY, job_id bigint NOT NULL, "
                  "n int NOT NULL, worker_pid int NOT NULL)")
    return dsn


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
        dsn = _prepare_database(admin_dsn, database)
        ok = _run(dsn, database, jobs=jobs, workers=workers, concurrency=concurrency, console=console)
        _say_how_to_inspect(dsn, database, console)
        return ok
    finally:
        lock.close()


def _say_how_to_inspect(dsn: str, database: str, console: Console) -> None:
    from ..errors import redact_dsn

    shown = redact_dsn(dsn)
    has_password = bool(conninfo.conninfo_to_dict(dsn).get("password"))
    console.print(f"The demo's jobs are in database {database!r} ({shown}); it stays until the next demo in that "
                  "database. Look at them with:", markup=False, soft_wrap=True)
    target = f"--dsn '{shown}'" if not has_password else f"--dsn '<your DSN with dbname={database}>'"
    for command in ("status", "jobs --state done --limit 5", "jobs --json --limit 1"):
        console.print(f"  skiplock {target} {command}", markup=False, soft_wrap=True)


def _run(dsn: str, database: str, *, jobs: int, workers: int, concurrency: int, console: Console) -> bool:
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
        with connect(dsn, autocommit=True) as db, Progress(
            TextColumn("[bold]draining"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
        ) as progress:
            bar = progress.add_task("jobs", total=jobs)
            done = 0
            deadline = start + 300
            while done < jobs and time.monotonic() < deadline:
                done = row_of(db.execute("SELECT count(*) FROM skiplock.jobs WHERE state = 'done'"))[0]
                progress.update(bar, completed=done)
                if victim.poll() is None and done >= jobs // 3 and not killed_in_flight:
                    killed_in_flight = _kill_with_jobs_in_flight(db, victim)
                    if killed_in_flight:
                        progress.console.print(f"[bold red]SIGKILL[/] worker {victim.pid} with job(s) "
                                               f"{_ids(killed_in_flight)} in flight")
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
    return _report(dsn, jobs, victim.pid, killed_in_flight, elapsed, console)


def _kill_with_jobs_in_flight(db: psycopg.Connection[Any], victim: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL ``victim`` if it has jobs in flight, and return them ([] and no kill if it has none).

    The victim is frozen first (SIGSTOP): a stopped process sends nothing, so once the server has
    processed what it already sent (its sessions are no longer active) its open transactions cannot
    change. The jobs of those transactions are in the rows of job_attempts (a job run alone) and
    job_batches (a batch) naming it; those and only those roll back with the kill."""
    sessions = ("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s AND state = 'active'",
                [f"skiplock-worker %:{victim.pid}/%"])
    victim.send_signal(signal.SIGSTOP)
    for _ in range(2):  # again after a pause: a message still in a socket buffer may arrive late
        deadline = time.monotonic() + 5
        while row_of(db.execute(*sessions))[0] and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
    rows = db.execute("SELECT job_id FROM skiplock.job_attempts WHERE worker LIKE %(w)s UNION "
                      "SELECT unnest(ids) FROM skiplock.job_batches WHERE worker LIKE %(w)s",
                      {"w": f"%:{victim.pid}/%"}).fetchall()
    if not rows:
        victim.send_signal(signal.SIGCONT)
        return []
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return sorted(r[0] for r in rows)


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


def _report(dsn: str, jobs: int, victim_pid: int, in_flight: list[int], elapsed: float, console: Console) -> bool:
    with connect(dsn, autocommit=True) as db:
        done, failed, other = row_of(db.execute(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'failed'), "
            "count(*) FILTER (WHERE state NOT IN ('done', 'failed')) FROM skiplock.jobs"))
        effects, distinct_jobs = row_of(db.execute("SELECT count(*), count(DISTINCT job_id) FROM demo_effects"))
        doubled = row_of(db.execute("SELECT count(*) FROM (SELECT job_id FROM demo_effects GROUP BY job_id "
                                    "HAVING count(*) > 1) d"))[0]
        redone = db.execute(
            "SELECT j.id, j.attempts, e.worker_pid FROM skiplock.jobs j JOIN demo_effects e ON e.job_id = j.id "
            "WHERE j.id = ANY(%s) ORDER BY j.id", [in_flight]).fetchall()
        victim_effects_for_inflight = row_of(db.execute(
            "SELECT count(*) FROM demo_effects WHERE job_id = ANY(%s) AND worker_pid = %s", [in_flight, victim_pid]
        ))[0]
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
