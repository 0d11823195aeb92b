"""The read model (skiplock/readmodel.py): what runs now, whichever its lease, which worker processes
are live, failures by class, the oldest ready job -- against a real PostgreSQL and real worker
processes, read through the API and the real CLI."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import skiplock
from skiplock.job import JobState
from skiplock.readmodel import all_pages
from support import ChildProcess, cli_argv, cli_env, kill_all, run_cli, wait_for

HERE = Path(__file__).resolve().parent
APP = "readmodel_tasks:app"


@dataclass
class WorkerProc(ChildProcess):
    proc: subprocess.Popen[bytes]
    log: Path
    kind = "worker"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def spawn(tmp_path: Path, dsn: str) -> Any:
    procs: list[WorkerProc] = []

    def start(*args: str, concurrency: int = 2) -> WorkerProc:
        log = tmp_path / f"worker{len(procs)}.log"
        argv = cli_argv(dsn, "worker", "--app", APP, "--concurrency", str(concurrency), "--poll-interval", "0.05",
                        *args)
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=HERE, env=cli_env(HERE), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        procs.append(WorkerProc(proc, log))
        return procs[-1]

    yield start
    kill_all(procs)


def cli(dsn: str, *args: str) -> str:
    result = run_cli(dsn, *args, cwd=HERE)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def rows_of(output: str) -> list[list[str]]:
    """The cells of every rich table row in ``output``."""
    return [[c.strip() for c in line.strip().strip("│┃").split("│")] for line in output.splitlines() if "│" in line]


def row_of(output: str, first_cell: str) -> list[str]:
    """The cells of the first rich table row whose first cell is ``first_cell``."""
    for cells in rows_of(output):
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r} in:\n{output}")


def listed_ids(output: str) -> set[int]:
    """The job ids of a ``skiplock jobs`` table (its rows' first cells)."""
    out = set()
    for line in output.splitlines():
        first = line.strip().strip("│┃").split("│")[0].strip()
        if first.isdigit():
            out.add(int(first))
    return out


def running_ids(app: skiplock.App) -> set[int]:
    return {r.job_id for r in all_pages(app.read_model.running_now)}


def test_a_transaction_lease_job_in_flight_is_running_everywhere_and_queued_again_once_its_worker_is_killed(
        app, dsn, tmp_path, spawn):
    gate = tmp_path / "gate"
    job_id = app.enqueue("hold", {"gate": str(gate)})
    other = app.enqueue("hold", {"gate": str(gate)}, queue="elsewhere")  # a queue nobody serves: stays queued
    worker = spawn("--queues", "default", concurrency=2)
    wait_for(lambda: job_id in running_ids(app), what="the job to show as running", on_timeout=worker.output)

    # its row still says 'queued' (locked by the lease transaction): the read model knows better
    [running] = app.read_model.running_now().items
    assert (running.job_id, running.queue, running.task, running.lease, running.attempt) == (
        job_id, "default", "hold", "transaction", 1)
    assert running.worker == f"{socket.gethostname()}:{worker.pid}" and running.slot in (0, 1)
    assert (running.host, running.pid) == (socket.gethostname(), worker.pid)
    assert running.since is not None and running.since <= running.read_at and running.lease_expires_at is None

    job = app.get_job(job_id)
    assert (job.state, job.attempts, job.worker) == (JobState.RUNNING, 1, f"{running.worker}/{running.slot}")
    assert job.started_at == running.since
    assert [j.id for j in app.list_jobs(state="running")] == [job_id]
    assert job_id not in {j.id for j in app.list_jobs(state="queued")} and other in {
        j.id for j in app.list_jobs(state="queued")}
    assert ("default", "running", 1) in app.counts() and ("default", "queued", 1) not in app.counts()
    assert [(q.queue, q.ready) for q in app.read_model.oldest_ready()] == [("elsewhere", 1)]  # not the one running

    listed = cli(dsn, "jobs", "--state", "running")
    assert row_of(listed, str(job_id))[3] == "running" and listed_ids(listed) == {job_id}
    assert re.search(r"^\s*state\s+running\s*$", cli(dsn, "jobs", str(job_id)), re.M)
    status = cli(dsn, "status")
    assert "Running now" in status
    cells = row_of(status, str(job_id))  # the running-now table: job, queue, task, lease, attempt, worker, ...
    assert cells[1:5] == ["default", "hold", "transaction", "1/5"] and str(worker.pid) in status
    workers = cli(dsn, "workers")
    assert str(worker.pid) in row_of(workers, running.worker)
    [info] = app.read_model.workers().items
    assert (info.pid, info.running, info.concurrency, info.queues) == (worker.pid, 1, 2, ["default"])

    worker.signal(signal.SIGKILL)
    worker.wait()
    # the lease session ends with its process: the job is queued again, with nobody running it
    wait_for(lambda: app.get_job(job_id).state == JobState.QUEUED, what="the job to be queued again")
    assert running_ids(app) == set()
    assert app.list_jobs(state="running") == [] and job_id in {j.id for j in app.list_jobs(state="queued")}
    assert ("default", "running", 1) not in app.counts()
    assert row_of(cli(dsn, "jobs", "--state", "queued"), str(job_id))[3] == "queued"
    assert listed_ids(cli(dsn, "jobs", "--state", "running")) == set()


def test_a_claimed_lease_job_in_flight_is_running_with_its_lease_until_it_finishes(app, dsn, tmp_path, spawn):
    gate = tmp_path / "gate"
    job_id = app.enqueue("hold_claimed", {"gate": str(gate)})
    worker = spawn(concurrency=1)
    wait_for(lambda: job_id in running_ids(app), what="the claimed job to show as running", on_timeout=worker.output)
    [running] = app.read_model.running_now().items
    assert (running.job_id, running.lease, running.attempt, running.slot) == (job_id, "claimed", 1, 0)
    assert (running.host, running.pid, running.worker) == (socket.gethostname(), worker.pid,
                                                           f"{socket.gethostname()}:{worker.pid}")
    assert running.lease_expires_at is not None and not running.lease_expired and running.since is not None
    assert [j.id for j in app.list_jobs(state="running")] == [job_id]
    assert row_of(cli(dsn, "jobs", "--state", "running"), str(job_id))[3] == "running"
    assert row_of(cli(dsn, "status"), str(job_id))[3] == "claimed"

    gate.touch()
    wait_for(lambda: app.get_job(job_id).state == JobState.DONE, what="the job to finish", on_timeout=worker.output)
    assert running_ids(app) == set() and app.list_jobs(state="running") == []


def test_workers_lists_every_live_worker_process_and_drops_one_that_stops(app, dsn, spawn):
    assert app.read_model.workers().items == []
    first = spawn("--queues", "a,b", concurrency=3)
    second = spawn(concurrency=1)
    wait_for(lambda: len(app.read_model.workers().items) == 2, what="both workers to register",
             on_timeout=lambda: first.output() + second.output())
    by_pid = {w.pid: w for w in app.read_model.workers()}
    one, two = by_pid[first.pid], by_pid[second.pid]
    assert (one.host, one.name, one.queues, one.concurrency) == (
        socket.gethostname(), f"{socket.gethostname()}:{first.pid}", ["a", "b"], 3)
    assert one.tasks == sorted(["fail_with", "hold", "hold_claimed"]) and one.running == 0
    assert one.started_at <= one.last_seen <= one.read_at
    assert (two.queues, two.concurrency) == (None, 1)  # every queue
    out = cli(dsn, "workers")
    assert row_of(out, one.name)[1:5] == [socket.gethostname(), str(first.pid), "a, b", "3"]
    assert row_of(out, two.name)[3] == "(all)"
    assert "Workers" in cli(dsn, "status")

    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    assert [w.pid for w in app.read_model.workers()] == [second.pid]
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    assert app.read_model.workers().items == []
    assert "No worker is running" in cli(dsn, "workers")


def test_an_unfinished_attempt_whose_session_is_gone_is_not_running_even_if_its_pid_is_live_again(app, dsn, db):
    """An attempt of a crashed session: job_attempts says it started, and a live worker session has the
    same backend pid (pids are reused) -- but that session's transaction began after the attempt, so it
    is not the attempt's lease. Only a session in the claiming transaction counts."""
    job_id = app.enqueue("hold", {"gate": "/nonexistent"})
    with psycopg.connect(dsn, application_name="skiplock-worker elsewhere:1/0") as lease:
        pid = lease.info.backend_pid
        lease.execute("SELECT 1")  # a transaction open on that session now
        db.execute("INSERT INTO skiplock.job_attempts (job_id, started, worker, backend_pid, started_at) "
                   "VALUES (%s, 1, 'elsewhere:1/0', %s, now() - interval '1 minute')", [job_id, pid])
        assert app.get_job(job_id).state == JobState.QUEUED
        assert running_ids(app) == set() and app.list_jobs(state="running") == []
        # the same row with the attempt started after the transaction began: that is a lease in flight
        db.execute("UPDATE skiplock.job_attempts SET started_at = now() WHERE job_id = %s", [job_id])
        assert app.get_job(job_id).state == JobState.RUNNING and running_ids(app) == {job_id}
        # the attempt finished but its outcome could not be written (an error pending for it): not running
        db.execute("""UPDATE skiplock.job_attempts SET pending_errors = '[{"attempt": 1, "error": "x"}]'
                      WHERE job_id = %s""", [job_id])
        assert app.get_job(job_id).state == JobState.QUEUED and running_ids(app) == set()


def test_jobs_of_a_batch_not_started_yet_are_not_running_and_the_batch_is_shown(app, dsn):
    release = threading.Event()

    @app.task(name="quick")
    def quick(job: Any, hold: bool = False) -> None:
        if hold:
            release.wait(60)

    app.enqueue_many([("quick", {})] * 40)  # known to be fast: the claim size grows to 8
    worker = app.worker(concurrency=1, batch_size=8, batch_budget=60, handle_signals=False, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: dict(((q, s), n) for q, s, n in app.counts()).get(("default", "done")) == 40,
                 what="the first jobs to be done")
        batch = app.enqueue_many([("quick", {})] * 2 + [("quick", {"hold": True})] + [("quick", {})] * 5)
        [in_flight] = wait_for(lambda: app.read_model.batches_in_flight().items, what="the batch to be in flight")
        assert in_flight.jobs == len(batch) and in_flight.slot == 0 and in_flight.worker == worker.name
        # two ran (done, not committed), one runs, five have not started: none is shown running
        assert running_ids(app) == set() and app.list_jobs(state="running") == []
        assert {app.get_job(i).state for i in batch} == {JobState.QUEUED}
        release.set()
        wait_for(lambda: {app.get_job(i).state for i in batch} == {JobState.DONE}, what="the batch to commit")
        assert app.read_model.batches_in_flight().items == []
    finally:
        release.set()
        worker.stop()
        thread.join(30)


def test_failures_by_error_class_and_the_oldest_ready_job_per_queue(app, db, dsn):
    @app.task(name="fail_with")
    def fail_with(job: Any, kind: str) -> None:
        raise {"ValueError": ValueError, "KeyError": KeyError}[kind]("on purpose")

    for kind, n in (("ValueError", 3), ("KeyError", 1)):
        app.enqueue_many([("fail_with", {"kind": kind}, {"max_attempts": 1})] * n)
    app.worker(concurrency=1).run(stop_when_empty=True)
    failures = [(f.queue, f.error_class, f.count) for f in app.read_model.failures()]
    assert failures == [("default", "ValueError", 3), ("default", "KeyError", 1)]
    assert all(f.last_failed_at is not None for f in app.read_model.failures())
    # by time: one failure two days old is left out of the last day's (and of status's)
    db.execute("UPDATE skiplock.jobs SET finished_at = now() - interval '2 days' WHERE id = "
               "(SELECT min(id) FROM skiplock.jobs WHERE last_error LIKE 'ValueError%%')")
    recent = [(f.queue, f.error_class, f.count) for f in app.read_model.failures(since=timedelta(days=1))]
    assert recent == [("default", "ValueError", 2), ("default", "KeyError", 1)]
    status = cli(dsn, "status")
    assert "Failed jobs by error class (last 24 h)" in status
    assert ["default", "ValueError", "2"] in [cells[:3] for cells in rows_of(status)], status

    old = app.enqueue("fail_with", {"kind": "KeyError"}, queue="q1")
    app.enqueue("fail_with", {"kind": "KeyError"}, queue="q1")
    app.enqueue("fail_with", {"kind": "KeyError"}, queue="q2", delay=3600)  # not due: not ready
    db.execute("UPDATE skiplock.jobs SET run_at = now() - interval '1 hour' WHERE id = %s", [old])
    app.pause_queue("q1")
    [q1] = app.read_model.oldest_ready()
    assert (q1.queue, q1.ready, q1.paused) == ("q1", 2, True)
    assert q1.age.total_seconds() >= 3600
    status = cli(dsn, "status")
    assert "Ready to run" in status
    assert any(cells[:2] == ["q1", "2"] and cells[2].startswith("1 h") and "(paused)" in cells[2]
               for cells in rows_of(status)), status


def test_list_jobs_pages_by_keyset_return_every_job_once_while_jobs_are_inserted(app, dsn):
    ids = set(app.enqueue_many([("hold", {"gate": "x"})] * 500))
    stop = threading.Event()
    inserted: list[int] = []

    def insert() -> None:
        with skiplock.App(dsn) as producer:
            while not stop.is_set():
                inserted.extend(producer.enqueue_many([("hold", {"gate": "x"})] * 7))

    thread = threading.Thread(target=insert)
    thread.start()
    seen: list[int] = []
    before = None
    try:
        wait_for(lambda: inserted, what="concurrent inserts to begin")
        while True:
            page = app.list_jobs(limit=37, before=before)
            seen.extend(j.id for j in page)
            if len(page) < 37:
                break
            before = page[-1].id
            wait_for(lambda n=len(inserted): len(inserted) > n, what="more inserts between pages")
    finally:
        stop.set()
        thread.join(30)
    assert len(seen) == len(set(seen)), "a job was listed twice"
    assert ids <= set(seen), "a job was skipped"
    assert seen == sorted(seen, reverse=True)


def test_running_and_workers_pages_by_keyset_return_every_row_once_while_rows_are_added(app, db):
    """Claimed-lease rows and workers' rows are added between pages; every row there at the start is
    listed exactly once."""
    backend = app.backend

    def add_running(n: int) -> list[int]:
        new = app.enqueue_many([("hold_claimed", {"gate": "x"})] * n)
        db.execute("UPDATE skiplock.jobs SET state = 'running', owner = gen_random_uuid(), attempts = 1, "
                   "worker = 'h:1/0', started_at = now(), lease_expires_at = now() + interval '1 hour' "
                   "WHERE id = ANY(%s)", [new])
        return new

    def add_workers(n: int) -> list[uuid.UUID]:
        new = [uuid.uuid4() for _ in range(n)]
        for w in new:
            backend.worker_seen(w, f"w-{w}", ["hold"], None, host="h", pid=1, concurrency=1)
        return new

    for add, fetch, key in ((add_running, app.read_model.running_now, lambda r: r.job_id),
                            (add_workers, app.read_model.workers, lambda w: w.id)):
        first = set(add(60))
        seen: list[Any] = []
        after = None
        while True:
            page = fetch(limit=9, after=after)
            seen.extend(key(r) for r in page)
            if page.cursor is None:
                break
            after = page.cursor
            add(3)  # rows added while paging (running ones with higher ids; workers newer)
        assert len(seen) == len(set(seen)) and first <= set(seen), fetch


def test_a_bad_cursor_or_limit_is_a_clear_error(app):
    with pytest.raises(ValueError, match="not a cursor of running"):
        app.read_model.running_now(after='["workers", ["x", "y"]]')
    with pytest.raises(ValueError, match="not a cursor of workers"):
        app.read_model.workers(after="garbage")
    with pytest.raises(ValueError, match="limit must be"):
        app.read_model.workers(limit=0)
    with pytest.raises(skiplock.InvalidJob, match="before must be"):
        app.list_jobs(before=0)
