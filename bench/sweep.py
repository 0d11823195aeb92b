"""Slot and process sweep (issue 16, goal 1): does throughput hold as a worker gets more slots, and
as a fixed number of slots is spread over more processes?

For jobs of 0, 1 and 10 ms (``noop``, ``sleep``), each cell drains ``n`` jobs with the public worker
CLI. The workers start first, on an empty queue; once each process has counted the others (its share
of leases, ``Governor.share``), the jobs arrive in one transaction and the workers drain them. (Until
session 30 the queue was prefilled and the workers started on it: on 2 cores eight processes'
start-ups spread over about two seconds and overlapped most of a 10,000-job drain, so the process
axis measured start-up as much as draining; ``cell(..., warm=False)`` still does that.) Each cell
reports, besides throughput (as in the drain scenario: first claim to last completion on the server's
clock, or the window in which every process was working), what the issue asks to watch:

- MultiXact SLRU reads per job (``pg_stat_slru``, multixact_offset + multixact_member, reset per cell;
  the cluster-wide view, so nothing else may run on the server meanwhile);
- buffer accesses per job on the jobs table and its indexes (``pg_statio_user_tables``: heap + index
  hits and reads, every statement of the cell but the enqueue, not the claim alone).

Each cell's throughput is compared with the previous cell of its series (the goal: non-decreasing
within noise, >= 0.9). A drain of 10,000 1 ms jobs lasts under two seconds, and on a shared machine
one such cell against its neighbour ranged from 0.54 to 1.24 in consecutive rounds: so every cell
runs ``--sweep-rounds`` times (3; 1 with ``--quick``), round after round of all of them, and the
figures are each cell's medians (the JSON keeps every round, and each ratio round by round).

Then the batching defaults (``batch_size`` 32, ``batch_slots`` 1, ``batch_budget`` 0.1 s) against
their neighbours, one setting at a time, at 1 × 16 slots for 0 and 1 ms jobs and for jobs that
write a row each, each as a ratio to the defaults' cell (issue 16, goal 5: the defaults are those the
sweep shows best). Opt-in (``--only sweep``): it is not part of a plain ``python -m bench``.
256 slots need ~520 connections: a server this run starts gets ``max_connections = 1200`` (one
restart before anything is measured: ``start_embedded``); on another server the cells that do not fit
are skipped, saying so.
"""

from __future__ import annotations

import time
from statistics import median
from typing import Any

import psycopg

from .common import Child, Context, Figure, checkpoint, fresh_db, one, settle, wait_for_workers
from .drain import check_drained
from .load import stop_all
from .tasks import make_app

SLOTS = (4, 16, 64, 256)
PROCESSES = (1, 2, 4, 8)   # at TOTAL_SLOTS slots in all
TOTAL_SLOTS = 64
KINDS = {0: 20_000, 1: 10_000, 10: 2_000}  # job length (ms) -> jobs per cell
QUICK_KINDS = {0: 4_000, 1: 2_000, 10: 400}
MAX_CONNECTIONS = 1200
DEFAULTS_SLOTS = 16
# (job length in ms, writing task or "") of the defaults' part: write and write_nested are 0 ms jobs
DEFAULT_KINDS = ((0, ""), (1, ""), (0, "write"), (0, "write_nested"))
# Each batching setting beside its default (worker/batching.py), the others at their defaults.
DEFAULT_NEIGHBOURS = (("batch_size", 8), ("batch_size", 16), ("batch_size", 64), ("batch_slots", 2),
                      ("batch_slots", 4), ("batch_budget", 0.05), ("batch_budget", 0.2))


def _max_connections(ctx: Context) -> int:
    with psycopg.connect(ctx.server.dsn, autocommit=True) as c:
        return int(one(c, "SHOW max_connections")[0])


def _counters(dsn: str) -> tuple[float, float, float]:
    """(MultiXact SLRU reads, jobs-table buffer accesses, subtransaction SLRU reads) so far."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_force_next_flush()")
        mx = one(c, "SELECT coalesce(sum(blks_hit + blks_read), 0) FROM pg_stat_slru WHERE name ILIKE 'multixact%%'")[0]
        buf = one(c, "SELECT coalesce(heap_blks_hit + heap_blks_read + idx_blks_hit + idx_blks_read, 0) "
                     "FROM pg_statio_user_tables WHERE relid = 'skiplock.jobs'::regclass")[0]
        sub = one(c, "SELECT coalesce(sum(blks_hit + blks_read), 0) FROM pg_stat_slru WHERE name = 'subtransaction'")[0]
    return float(mx), float(buf), float(sub)


def _jobs_buffers_of_this_transaction(conn: psycopg.Connection[Any]) -> float:
    """Buffer accesses (hits + reads) of the current transaction on the jobs table and its indexes."""
    return float(one(conn, "SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(r)), 0) FROM "
                           "(SELECT 'skiplock.jobs'::regclass::oid AS r UNION ALL SELECT indexrelid FROM pg_index "
                           " WHERE indrelid = 'skiplock.jobs'::regclass) rels")[0])


def cell(ctx: Context, ms: int, n: int, processes: int, slots: int, writing: str = "",
         warm: bool = True) -> dict[str, Any]:
    """Drain ``n`` jobs of ``ms`` ms with ``processes`` x ``slots``; ``writing``: jobs of that task
    instead (``write`` or ``write_nested``, bench/tasks.py: one row inserted each).

    ``warm`` (the default): the workers start first, on an empty queue, and once every process has
    counted the others (``common.wait_for_workers``) all ``n`` jobs arrive in one transaction -- so the drain
    measures running workers, not their start. Otherwise (cold) the queue is prefilled and the
    workers start on it: on 2 cores, 8 processes' start-ups (imports, sessions) spread over ~2 s
    and overlap most of a 10,000-job drain. Buffer accesses per job leave out the enqueue's own."""
    job = (writing, {}) if writing else ("noop", {}) if ms == 0 else ("sleep", {"ms": ms})
    mode = "warm" if warm else "cold"
    with fresh_db(ctx.server, f"sweep_{writing}{ms}ms_{processes}x{slots}") as dsn:
        app = make_app(dsn)
        enqueue_buffers = 0.0
        worker_cpu: float | None = None  # µs per job, warm cells only
        server_cpu_per_job: float | None = None
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                if writing:
                    c.execute("CREATE TABLE bench_writes (job_id bigint NOT NULL)")
            if not warm:
                _enqueue(app, dsn, job, n)
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute("VACUUM ANALYZE skiplock.jobs")
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SELECT pg_stat_reset_slru()")
            checkpoint(dsn)
            workers = [ctx.worker(dsn, slots, stop_when_empty=not warm) for _ in range(processes)]
            try:
                if warm:
                    wait_for_workers(dsn, processes)
                mx0, buf0, sub0 = _counters(dsn)
                if warm:
                    server_cpu = ctx.cpu()
                    cpu0, server0 = sum(w.cpu_now() for w in workers), server_cpu.total()
                    enqueue_buffers = _enqueue(app, dsn, job, n)
                    _wait_done(dsn, n, workers, timeout=max(300.0, n / 20))
                    cpu1, server1 = sum(w.cpu_now() for w in workers), server_cpu.total()
                    worker_cpu = (cpu1 - cpu0) / n * 1e6
                    if server0 is not None and server1 is not None:
                        server_cpu_per_job = (server1 - server0) / n * 1e6
                    finished = stop_all(workers)
                else:
                    finished = [w.wait(timeout=max(300.0, n / 20)) for w in workers]
            finally:
                stop_all(workers)  # none is left running, whatever went wrong
        finally:
            app.close()
        failed = [f for f in finished if f.returncode]
        if failed:  # before the count: a worker that could not start says why
            raise RuntimeError(f"sweep worker exit codes {[f.returncode for f in finished]}: "
                               f"{failed[0].stderr[-2000:]}")
        settle(dsn)
        mx1, buf1, sub1 = _counters(dsn)
        if writing:  # each job's row once: the handler's write committed with its job, never twice
            with psycopg.connect(dsn, autocommit=True) as c:
                rows, distinct = one(c, "SELECT count(*), count(DISTINCT job_id) FROM bench_writes")
            if rows != n or distinct != n:
                raise RuntimeError(f"writing jobs: {rows} rows for {distinct} of {n} jobs in bench_writes")
        try:
            checked = check_drained(dsn, n)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; the first worker's log ends: {finished[0].stderr[-2000:]}") from None
    return {"ms": ms, "writing": writing, "jobs": n, "processes": processes, "slots_per_process": slots,
            "start": mode, "throughput": checked["throughput"], "span_s": checked["span_s"],
            "multixact_reads_per_job": (mx1 - mx0) / n, "jobs_buffers_per_job": (buf1 - buf0 - enqueue_buffers) / n,
            "enqueue_buffers_per_job": enqueue_buffers / n, "subtrans_reads_per_job": (sub1 - sub0) / n,
            "worker_cpu_us_per_job": worker_cpu, "server_cpu_us_per_job": server_cpu_per_job}


def _enqueue(app: Any, dsn: str, job: tuple[str, dict[str, Any]], n: int) -> float:
    """``n`` copies of ``job``, 50,000 per transaction; returns the jobs-table buffer accesses of
    those transactions (read in each before it commits)."""
    buffers = 0.0
    with psycopg.connect(dsn) as c:
        for start in range(0, n, 50_000):
            app.enqueue_many([job] * min(50_000, n - start), conn=c)
            buffers += _jobs_buffers_of_this_transaction(c)
            c.commit()
    return buffers


def _wait_done(dsn: str, n: int, workers: list[Child], timeout: float) -> None:
    """Until ``n`` jobs are done (a worker that exits meanwhile, or the timeout, raises)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while one(c, "SELECT count(*) FROM skiplock.jobs WHERE state = 'done'")[0] < n:
            gone = [f for f in (w.poll() for w in workers) if f is not None]
            if gone:
                raise RuntimeError(f"sweep worker exited with {gone[0].returncode} before the drain ended: "
                                   f"{gone[0].stderr[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sweep: the drain of {n} jobs did not end within {timeout:.0f}s")
            time.sleep(0.02)


def run(ctx: Context) -> list[Figure]:
    kinds = QUICK_KINDS if ctx.sizes.drain_jobs < 20_000 else KINDS
    available = _max_connections(ctx)
    rounds = ctx.sizes.sweep_rounds
    figures: list[Figure] = []
    results: list[dict[str, Any]] = []
    series = [("slots", [(1, s) for s in SLOTS]), ("processes", [(p, TOTAL_SLOTS // p) for p in PROCESSES])]
    for ms, n in kinds.items():
        cells: list[tuple[int, int]] = []  # every cell of both series once (1 x 64 is in both)
        for _, members in series:
            for processes, slots in members:
                if (processes, slots) in cells:
                    continue
                if processes * (2 * slots + 3) + 10 > available:
                    ctx.log(f"sweep: {ms} ms, {processes} × {slots}: skipped, needs more than "
                            f"max_connections = {available}")
                    continue
                cells.append((processes, slots))
        # Round after round of every cell, so a slow spell of a shared machine falls on all of them
        # alike; each cell's figures are its medians, and each ratio is one of medians.
        runs: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in cells}
        for rnd in range(rounds):
            for processes, slots in cells:
                ctx.log(f"sweep: {n:,} jobs of {ms} ms, {processes} × {slots} slots"
                        + (f", round {rnd + 1} of {rounds}" if rounds > 1 else ""))
                r = {**cell(ctx, ms, n, processes, slots), "round": rnd + 1}
                results.append(r)
                runs[(processes, slots)].append(r)
                ctx.log(f"sweep: {r['throughput']:,.0f} jobs/s, MultiXact {r['multixact_reads_per_job']:.2f}/job, "
                        f"buffers {r['jobs_buffers_per_job']:.1f}/job")
        for processes, slots in cells:
            ctx.refs[f"sweep.{ms}ms.{processes}x{slots}"] = median(r["throughput"] for r in runs[(processes, slots)])
        for axis, members in series:
            previous: tuple[int, int] | None = None
            for processes, slots in members:
                if (processes, slots) not in runs:
                    continue
                label, key = f"{processes} × {slots}", f"sweep.{ms}ms.{processes}x{slots}"
                mine = runs[(processes, slots)]
                details: dict[str, Any] = {"rounds": [r["throughput"] for r in mine]}
                if previous is not None:  # the same round's ratio, round by round: how steady it is
                    details["ratio_per_round"] = [a["throughput"] / b["throughput"]
                                                  for a, b in zip(mine, runs[previous])]
                scenario = f"sweep {ms} ms ({axis})"
                prev_key = None if previous is None else f"sweep.{ms}ms.{previous[0]}x{previous[1]}"
                figures.append(Figure(scenario, f"throughput, {label} slots", ctx.refs[key], "jobs/s",
                                      reference="previous cell" if previous else "", baseline_key=prev_key,
                                      goal=">= 0.9" if previous else None, details=details,
                                      note=f"median of {len(mine)} rounds" if len(mine) > 1 else ""))
                figures.append(Figure(scenario, f"MultiXact SLRU reads per job, {label}",
                                      median(r["multixact_reads_per_job"] for r in mine), "reads/job"))
                figures.append(Figure(scenario, f"jobs-table buffer accesses per job, {label}",
                                      median(r["jobs_buffers_per_job"] for r in mine), "buffers/job"))
                previous = (processes, slots)
    ctx.raw["sweep"] = results
    figures += _defaults(ctx, kinds, available)
    return figures


def _defaults(ctx: Context, kinds: dict[int, int], available: int) -> list[Figure]:
    """Issue 16, goal 5: the batching defaults against their neighbours, at DEFAULTS_SLOTS slots for 0
    and 1 ms jobs, and for jobs that write a row each (``write``: each handler a subtransaction, as
    writing handlers in a batch are; ``write_nested``: two, as an ORM session joined with a savepoint
    -- a transaction with more than 64 subtransaction ids overflows PostgreSQL's cache of them, which
    the other jobs cannot show) -- each setting alone, the others at their defaults, through
    ``bench.worker`` (``app.worker(**options)``). Each figure is a ratio to the defaults' cell:
    medians of ``sweep_rounds`` rounds of every setting, as the cells; the writing kinds' figures
    also give subtransaction SLRU reads per job."""
    figures: list[Figure] = []
    rows: list[dict[str, Any]] = []
    slots = DEFAULTS_SLOTS
    if 2 * slots + 13 > available:
        ctx.log(f"sweep defaults: skipped, needs more than max_connections = {available}")
        return figures
    saved = ctx.worker_options
    settings: list[tuple[str, dict[str, Any]]] = [("defaults", {}), *((f"{option} = {value}", {option: value})
                                                                      for option, value in DEFAULT_NEIGHBOURS)]
    rounds = ctx.sizes.sweep_rounds
    try:
        for ms, writing in DEFAULT_KINDS:
            n, kind = kinds[ms], f"{ms} ms{', ' + writing if writing else ''}"
            runs: dict[str, list[dict[str, Any]]] = {}
            for rnd in range(rounds):  # round after round, as the cells above
                for name, options in settings:
                    ctx.worker_options = {**saved, "listen": True, **options}  # bench.worker
                    r = {**cell(ctx, ms, n, 1, slots, writing), "options": name, "round": rnd + 1}
                    rows.append(r)
                    runs.setdefault(name, []).append(r)
                    ctx.log(f"sweep defaults: {kind}, {name} {r['throughput']:,.0f} jobs/s")
            key = f"sweep.defaults.{ms}ms{'.' + writing if writing else ''}"
            for name, options in settings:
                mine = [r["throughput"] for r in runs[name]]
                note = f"median of {len(mine)} rounds" if len(mine) > 1 else ""
                if not options:
                    ctx.refs[key] = median(mine)
                    figures.append(Figure(f"sweep defaults {kind}", f"throughput, the defaults, 1 × {slots}",
                                          ctx.refs[key], "jobs/s", note=note, details={"rounds": mine}))
                else:
                    figures.append(Figure(f"sweep defaults {kind}", f"throughput, {name}, 1 × {slots}",
                                          median(mine), "jobs/s", reference="the defaults' cell",
                                          baseline_key=key, note=note, details={"rounds": mine}))
                if writing:
                    figures.append(Figure(f"sweep defaults {kind}", f"subtransaction SLRU reads per job, {name}",
                                          median(r["subtrans_reads_per_job"] for r in runs[name]), "reads/job"))
    finally:
        ctx.worker_options = saved
    ctx.raw["sweep_defaults"] = rows
    return figures
