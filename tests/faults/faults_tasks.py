"""Tasks run by the fault-injection suite's worker processes (``--app faults_tasks:app``).

Every task of both lease modes leaves two traces, and the suite's invariants are checked on them:

- an *execution record*: one line ``job_id attempt pid`` appended (O_APPEND, before the handler does
  anything else) to ``$FAULTS_EXEC_DIR/<pid>.log``. It stands for an external effect (an email): it
  survives every rollback and every kill, so it counts how many times a handler really ran;
- a *database-local effect*: one row in the test database's ``effects`` table, written through
  ``job.conn``. It commits with the job's finishing write or not at all, so it counts how many times
  a job was really finished.

Transaction-lease tasks write the effect first and then work (the effect rides in the open lease
transaction); claimed-lease tasks work first and write the effect at the end (a claimed-lease handler
runs outside any transaction until it first uses ``job.conn``).

Settings read from the environment when the worker starts, since the CLI has no flags for them:
``FAULTS_LEASE_TIMEOUT`` (``App(lease_timeout=...)``, default 600), ``FAULTS_LEASE_SECONDS`` (the
claimed tasks' ``lease_seconds``, default 2) and ``FAULTS_RESCUE_INTERVAL`` (the worker's rescuer
interval, default 0.5 s; skiplock's default is 5 s). The CLI's ``--dsn`` configures ``app``; nothing
here connects at import time.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any

import skiplock

TXN_TASKS = ("txn_effect", "txn_hang", "txn_hang_db", "txn_hog", "txn_raise_base")
CLAIMED_TASKS = ("claimed_effect", "claimed_hang", "claimed_hog", "claimed_raise_base")
HANG_TIMEOUT = 1.0  # seconds: the hang tasks' timeout
HOG_CHUNK = 16 << 20  # bytes allocated per step by the hog tasks


class FaultsBaseException(BaseException):
    """Neither an Exception nor SystemExit/KeyboardInterrupt: a handler's own BaseException subclass."""


class FaultsApp(skiplock.App):
    """An App whose workers run their rescuer every ``FAULTS_RESCUE_INTERVAL`` seconds (the Worker
    option exists; the CLI does not expose it)."""

    def worker(self, queues: Any = None, concurrency: int = 4, **options: Any) -> Any:
        options.setdefault("rescue_interval", float(os.environ.get("FAULTS_RESCUE_INTERVAL", "0.5")))
        return super().worker(queues=queues, concurrency=concurrency, **options)


_exec_lock = threading.Lock()
_exec_fd: int | None = None


def record_execution(job: Any) -> None:
    """Append ``job_id attempt pid`` to this process's execution log (a no-op without FAULTS_EXEC_DIR)."""
    global _exec_fd
    directory = os.environ.get("FAULTS_EXEC_DIR")
    if not directory:
        return
    with _exec_lock:
        if _exec_fd is None:
            _exec_fd = os.open(os.path.join(directory, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                               0o644)
        os.write(_exec_fd, f"{job.id} {job.attempt} {os.getpid()}\n".encode())


def write_effect(job: Any, lease: str) -> None:
    """Through a DB-API cursor (``%s`` placeholders): the same on psycopg and PyMySQL (test_fault_mariadb.py)."""
    with job.conn.cursor() as cur:
        cur.execute("INSERT INTO effects (job_id, attempt, pid, lease) VALUES (%s, %s, %s, %s)",
                    (job.id, job.attempt, os.getpid(), lease))


def _work(job: Any, sleep: float, sleep_first: float) -> None:
    if sleep:
        time.sleep(sleep)
    if sleep_first and job.attempt == 1:
        time.sleep(sleep_first)


HOG_MAX_CAP = 4 << 30


def _hog() -> None:
    """Allocate (and touch) memory until the allocator refuses: MemoryError under RLIMIT_AS. Refuses
    to start in a process without an address-space cap (it would eat the machine)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > HOG_MAX_CAP:
        raise RuntimeError("the hog task runs only in a worker capped with RLIMIT_AS (at most 4 GiB)")
    hoard = []
    while True:
        hoard.append(bytearray(HOG_CHUNK))  # zero-filled: the pages are really written


def _raise_base(job: Any, kind: str) -> None:
    if kind == "SystemExit":
        raise SystemExit(f"handler of job {job.id} called sys.exit")
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt(f"handler of job {job.id} raised KeyboardInterrupt")
    if kind == "FaultsBaseException":
        raise FaultsBaseException(f"handler of job {job.id} raised a bare BaseException subclass")
    raise ValueError(f"unknown kind {kind!r}")


def build_app(dsn: str | None = None) -> FaultsApp:
    """The suite's App with every task registered (the tests build one as a producer, so enqueued
    jobs get the same task defaults the workers use)."""
    app = FaultsApp(dsn, lease_timeout=float(os.environ.get("FAULTS_LEASE_TIMEOUT", "600")))
    lease_seconds = float(os.environ.get("FAULTS_LEASE_SECONDS", "2"))

    # ---- transaction lease (the default) -------------------------------------------------------

    @app.task(name="txn_effect", max_attempts=25, retry=0.0)
    def txn_effect(job: Any, sleep: float = 0.0, sleep_first: float = 0.0) -> dict[str, int]:
        record_execution(job)
        write_effect(job, "transaction")
        _work(job, sleep, sleep_first)
        return {"pid": os.getpid(), "attempt": job.attempt}

    @app.task(name="txn_hang", max_attempts=2, retry=0.0, timeout=HANG_TIMEOUT)
    def txn_hang(job: Any) -> None:
        record_execution(job)
        write_effect(job, "transaction")
        time.sleep(3600)  # stuck in Python, past the timeout

    @app.task(name="txn_hang_db", max_attempts=2, retry=0.0, timeout=HANG_TIMEOUT)
    def txn_hang_db(job: Any) -> None:
        record_execution(job)
        write_effect(job, "transaction")
        job.conn.execute("SELECT pg_sleep(3600)")  # stuck in the database, past the timeout

    @app.task(name="txn_hog", max_attempts=2, retry=0.0)
    def txn_hog(job: Any) -> None:
        record_execution(job)
        write_effect(job, "transaction")
        _hog()

    @app.task(name="txn_raise_base", max_attempts=2, retry=0.0)
    def txn_raise_base(job: Any, kind: str) -> None:
        record_execution(job)
        write_effect(job, "transaction")
        _raise_base(job, kind)

    # ---- claimed lease ---------------------------------------------------------------------------

    @app.task(name="claimed_effect", lease="claimed", lease_seconds=lease_seconds, max_attempts=25, retry=0.0)
    def claimed_effect(job: Any, sleep: float = 0.0, sleep_first: float = 0.0) -> dict[str, int]:
        record_execution(job)
        _work(job, sleep, sleep_first)
        write_effect(job, "claimed")
        return {"pid": os.getpid(), "attempt": job.attempt}

    @app.task(name="claimed_hang", lease="claimed", lease_seconds=lease_seconds, max_attempts=2, retry=0.0,
              timeout=HANG_TIMEOUT)
    def claimed_hang(job: Any) -> None:
        record_execution(job)
        time.sleep(3600)
        write_effect(job, "claimed")

    @app.task(name="claimed_hog", lease="claimed", lease_seconds=lease_seconds, max_attempts=2, retry=0.0)
    def claimed_hog(job: Any) -> None:
        record_execution(job)
        _hog()
        write_effect(job, "claimed")

    @app.task(name="claimed_raise_base", lease="claimed", lease_seconds=lease_seconds, max_attempts=2, retry=0.0)
    def claimed_raise_base(job: Any, kind: str) -> None:
        record_execution(job)
        _raise_base(job, kind)
        write_effect(job, "claimed")

    return app


app = build_app()
