"""Outage recovery: how soon a worker resumes after the server was down, and how long a producer's
``enqueue_many`` takes to fail while it is down.

The scenario needs a server it may stop, so it always starts its own embedded PostgreSQL in a
temporary directory (whatever ``--dsn`` says), with one worker process (the public CLI, 4 slots,
default options) and one producer App in this process, both connected before each outage. Per
outage length (``--outages``, default 5, 17 and 60 s):

1. the server is stopped (``pg_ctl -m fast stop``); while it is down the producer's
   ``enqueue_many`` of 100 jobs is timed until it raises (its pool was open: the first call meets
   dead pooled connections; then a second call);
2. after the outage the server is started on the same port and socket; *ready* is when
   ``pg_ctl -w start`` returns (the server accepts connections);
3. the producer enqueues one ``stamp`` job (the time from ready until that call returns is the
   producer's recovery) and the worker runs it; **resume** = handler start (``time.time()`` in the
   worker, stored with the job) minus ready.

The worker's log is read at the end: WARNING lines per outage, and driver-internal lines
("Pipeline [BAD]", the pool's "error connecting") that should not be there at all.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from .common import Context, Figure, Server, spawn_worker, wait_for_sessions, with_db
from .tasks import LATENCY_TABLE, make_app

RESUME_TARGET_S = 2.0
CONCURRENCY = 4


def _running(data_dir: Path) -> Any:
    from .common import embedded_module

    embedded = embedded_module()
    return embedded._read_running(data_dir)


def _wait_stamp(dsn: str, job_id: int, timeout: float) -> float:
    """The handler start time of ``job_id``, once the worker has run it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as c:
                row = c.execute("SELECT handler_start FROM bench_latency WHERE job_id = %s", [job_id]).fetchone()
                if row is not None:
                    return float(row[0])
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not run job {job_id} within {timeout:.0f} s of the server's return")
        time.sleep(0.01)


def _time_failure(call: Any) -> tuple[float, str]:
    """Seconds until ``call()`` raises (it should: the server is down), and what it raised."""
    t = time.perf_counter()
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error is the measurement
        return time.perf_counter() - t, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return time.perf_counter() - t, "no error (the call succeeded while the server was down?)"


def measure(ctx: Context, outages: list[float]) -> dict[str, Any]:
    from .common import embedded_module

    embedded = embedded_module()
    root = Path(tempfile.mkdtemp(prefix="skiplock-bench-outage-"))
    data_dir = root / "pg"
    server = embedded.ensure_server(data_dir)
    port, socket_dir = server.port, server.socket_dir
    own = Server(dsn=server.dsn, bin_dir=server.bin_dir, postmaster_pid=server.pid, embedded_data_dir=data_dir,
                 owns_server=True, _cleanup_dir=root)
    worker = None
    app = None
    runs: list[dict[str, Any]] = []
    try:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE bench_outage")
        dsn = with_db(server.dsn, "bench_outage")
        app = make_app(dsn)
        app.migrate()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(LATENCY_TABLE)
        worker = spawn_worker(dsn, CONCURRENCY, stop_when_empty=False)
        wait_for_sessions(dsn, "skiplock-worker", CONCURRENCY)
        _wait_stamp(dsn, app.enqueue("stamp", {}), 30)  # warm: the worker serves, the producer's pool is open
        for seconds in outages:
            ctx.log(f"outage: server down for {seconds:g} s")
            app.enqueue("noop", {})  # the producer's pool holds a (soon dead) connection
            stopped = time.monotonic()
            embedded.stop_server(data_dir, mode="fast")
            first_fail, first_error = _time_failure(lambda: app.enqueue_many([("noop", {})] * 100))
            second_fail, second_error = _time_failure(lambda: app.enqueue_many([("noop", {})] * 100))
            time.sleep(max(0.0, seconds - (time.monotonic() - stopped)))
            server.pg_ctl("-w", "-t", "60", "-o", f"-p {port} -k {socket_dir}", "start", timeout=90)
            ready, ready_wall = time.monotonic(), time.time()
            down_s = ready - stopped
            job_id = None
            producer_errors = 0
            while job_id is None:  # the producer's recovery: how soon its enqueue works again
                try:
                    job_id = app.enqueue("stamp", {})
                except Exception:  # noqa: BLE001 - counted; the figure says how long it took
                    producer_errors += 1
                    if time.monotonic() - ready > 60:
                        raise
            producer_s = time.monotonic() - ready
            started = _wait_stamp(dsn, job_id, 120)
            run = {"outage_s": seconds, "down_s": down_s, "resume_s": started - ready_wall,
                   "producer_first_enqueue_s": producer_s, "producer_errors_after_ready": producer_errors,
                   "enqueue_many_fail_first_s": first_fail, "enqueue_many_fail_first_error": first_error,
                   "enqueue_many_fail_later_s": second_fail, "enqueue_many_fail_later_error": second_error}
            ctx.log(f"outage: {seconds:g} s down -> worker resumed {run['resume_s']:.2f} s after the server was "
                    f"ready; enqueue_many failed after {first_fail:.2f} s (then {second_fail:.2f} s)")
            runs.append(run)
    finally:
        if app is not None:
            app.close()
        if worker is not None:
            worker.signal()
        if _running(data_dir) is None:
            server.pg_ctl("-w", "-t", "60", "-o", f"-p {port} -k {socket_dir}", "start", timeout=90)
    finished = worker.wait(60) if worker is not None else None
    own.close()
    log = finished.stderr if finished is not None else ""
    # every WARNING but the one announcing the worker's own shutdown (SIGTERM) at the end
    warnings = [line for line in log.splitlines() if " WARNING " in line and "received SIG" not in line]
    noise = [line for line in log.splitlines() if "Pipeline" in line or "error connecting" in line
             or " psycopg" in line]
    return {"runs": runs, "worker_warning_lines": len(warnings), "worker_warnings": warnings[:20],
            "driver_noise_lines": len(noise), "driver_noise": noise[:10],
            "connect_timeout_s": getattr(app, "connect_timeout", None),
            "worker_exit": None if finished is None else finished.returncode}


def run(ctx: Context) -> list[Figure]:
    outages = list(ctx.sizes.outage_seconds)
    ctx.log(f"outage: {', '.join(f'{s:g}' for s in outages)} s outages of a private embedded server, "
            f"1 worker x {CONCURRENCY} slots")
    r = measure(ctx, outages)
    ctx.raw["outage"] = r
    s = "outage"
    figures: list[Figure] = []
    for run_ in r["runs"]:
        figures.append(Figure(s, f"worker resumes after a {run_['outage_s']:g} s outage (server ready → job started)",
                              run_["resume_s"], "s", baseline_or_target=RESUME_TARGET_S, reference="target",
                              goal="<= 1", details=run_))
    if r["runs"]:
        timeout = r["connect_timeout_s"]
        worst_first = max(x["enqueue_many_fail_first_s"] for x in r["runs"])
        worst_later = max(x["enqueue_many_fail_later_s"] for x in r["runs"])
        figures += [
            Figure(s, "enqueue_many while down: fails after (first call, pool had a connection)", worst_first, "s",
                   baseline_or_target=timeout, reference="connect_timeout", goal="<= 1.2",
                   note=r["runs"][0]["enqueue_many_fail_first_error"][:120]),
            Figure(s, "enqueue_many while down: fails after (next call)", worst_later, "s",
                   note=r["runs"][0]["enqueue_many_fail_later_error"][:120]),
            Figure(s, "producer: first enqueue after the server is ready",
                   max(x["producer_first_enqueue_s"] for x in r["runs"]), "s"),
        ]
    figures += [
        Figure(s, "worker WARNING lines per outage", r["worker_warning_lines"] / max(1, len(r["runs"])), "lines",
               baseline_or_target=1.0, reference="target", goal="<= 1", details={"lines": r["worker_warnings"]}),
        Figure(s, "driver-internal lines in the worker log (Pipeline [BAD], pool errors)", r["driver_noise_lines"],
               "lines", goal="== 0", goal_on="value", details={"lines": r["driver_noise"]}),
    ]
    return figures
