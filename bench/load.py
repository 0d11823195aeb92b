"""Pickup latency at load (issue 16, goal 2), and the offered-load engine the soak reuses.

Each cell is P worker processes × S slots through the public CLI with its default batching (cells
1 × 16 and 2 × 16: 16 is the slot count the issue's figures start from), in three steps:

1. **Capacity**: a prefilled queue of 1 ms jobs (``sleep``, ms=1) is drained by the cell's workers;
   capacity is jobs / (first claim → last completion) on the server's clock, as in the drain scenario.
2. **Offered load**: a producer thread in this process offers ``pickup`` jobs (ms=1) at
   :data:`FRACTION` (50 %) of that capacity to fresh workers with the same configuration: every
   :data:`TICK_S` it enqueues, in one ``enqueue_many`` call, the jobs due by then (rate × elapsed −
   sent), so the jobs come in small bursts at a steady mean rate; the rate it achieved is reported.
   After a short warm-up, a window of N seconds is measured.
3. **Pickup latency** of every job created in the window = handler start − ``created_at``:

   - handler start: ``time.time()`` first thing in the handler, returned as the job's result
     (``bench.tasks.pickup``; the handler never touches the database, so the measurement adds no
     savepoint and no statement to the job).
   - ``created_at``: the column's default ``now()``, the start of the inserting transaction. A call
     of fewer than 1,000 jobs (``COPY_MIN_JOBS``; the producer's calls are capped below it) is one
     INSERT statement on an autocommit pool connection, so its transaction begins with that
     statement: ``created_at`` is when the server began the INSERT. The job becomes claimable at the
     statement's COMMIT, a little later, so this latency includes the insert's own execution and
     commit (the issue's "insert → handler start"; an upper bound of what a worker can influence).
     The run checks that every ``created_at`` lies inside the client's window of its
     ``enqueue_many`` call (time before → time after), reports that call's duration, and reports
     the latency from the call's return too (a lower bound: the commit happened before it).

   Both times come from this machine's system clock (the server runs here); a server on another
   machine needs a synchronised clock for these figures to mean anything.

   Split at the claim: a done job's ``started_at`` is its claim transaction's start (``now()`` of the
   lease that ran it), so insert → claim is ``started_at − created_at`` (the wake-up, the claim's
   BEGIN, and any wait for a free slot) and claim → handler start is the rest (the claim and
   ``start_batch`` round trips, and the wait behind the job's batch-mates). Jobs with the same
   ``started_at`` came from one claim: their count is the claim's size.

Also reported: completions per second in the window (against the offered rate), the backlog (queued
and running jobs) at the end of the window, and every worker log line that reports a problem.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from typing import Any, Sequence

import psycopg

from .common import (Child, Context, DbCounters, Figure, Finished, checkpoint, fresh_db, one, percentile, settle, summary_ms,
                     wait_for_workers, worker_summary)
from .drain import check_drained
from .tasks import make_app

CELLS = ((1, 16), (2, 16))  # (worker processes, slots per process)
FRACTION = 0.5              # offered load, as a fraction of the measured capacity
TICK_S = 0.005              # the producer enqueues what is due every 5 ms
MAX_CALL = 999              # below COPY_MIN_JOBS: one INSERT statement per call (see the module docstring)
JOB_MS = 1.0
P50_TARGET_MS = 5.0
P99_TARGET_MS = 25.0
# The worker's answer to our own SIGTERM at the end of a run: logged at WARNING, not a problem here.
OUR_SHUTDOWN = re.compile(r"received SIGTERM: finishing in-flight jobs")


def summary_of(stderr: str) -> dict[str, Any]:
    """``worker_summary`` without the line that acknowledges the SIGTERM we sent to stop it."""
    s = worker_summary(stderr)
    lines = [line for line in s["problem_lines"] if not OUR_SHUTDOWN.search(line)]
    return {**s, "problems": s["problems"] - (len(s["problem_lines"]) - len(lines)), "problem_lines": lines}


class Producer(threading.Thread):
    """Offers ``rate`` jobs per second of ``task`` (with ``args``) until :meth:`stop`: every ``tick``
    seconds one ``enqueue_many`` of the jobs due by then. Keeps (first id, last id, time before the
    call, time after it) for every call; :meth:`take_calls` hands them over (and forgets them)."""

    def __init__(self, dsn: str, rate: float, *, task: str = "pickup", args: dict[str, Any] | None = None,
                 tick: float = TICK_S):
        super().__init__(name="bench-producer", daemon=True)
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.app = make_app(dsn)
        self.rate, self.tick = rate, tick
        self.item = (task, {"ms": JOB_MS} if args is None else args)
        self.sent = 0
        self.calls_made = 0
        self.max_due = 0          # most jobs one tick had to send (bursts beyond rate × tick: the producer lagged)
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.error: BaseException | None = None
        self._calls: list[tuple[int, int, float, float]] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            t0 = time.perf_counter()
            self.started_at = time.time()
            k = 0
            while not self._halt.is_set():
                due = int(self.rate * (time.perf_counter() - t0)) - self.sent
                self.max_due = max(self.max_due, due)
                while due > 0:
                    n = min(due, MAX_CALL)
                    before = time.time()
                    ids = self.app.enqueue_many([self.item] * n)
                    after = time.time()
                    with self._lock:
                        self._calls.append((ids[0], ids[-1], before, after))
                        self.sent += n
                        self.calls_made += 1
                    due -= n
                k = max(k + 1, int((time.perf_counter() - t0) / self.tick))
                delay = t0 + k * self.tick - time.perf_counter()
                if delay > 0:
                    self._halt.wait(delay)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            self.stopped_at = time.time()
            self.app.close()

    def take_calls(self) -> list[tuple[int, int, float, float]]:
        with self._lock:
            calls, self._calls = self._calls, []
        return calls

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
        if self.error is not None:
            raise RuntimeError(f"producer failed: {type(self.error).__name__}: {self.error}") from self.error

    def achieved_rate(self) -> float:
        if self.started_at is None:
            return 0.0
        return self.sent / max(1e-9, (self.stopped_at or time.time()) - self.started_at)


def stop_all(workers: Sequence[Child], timeout: float = 30.0) -> list[Finished]:
    """SIGTERM every worker, then wait for each (SIGKILL past ``timeout``): none is left running,
    whatever went wrong before."""
    for w in workers:
        w.signal()
    finished: list[Finished] = []
    for w in workers:
        try:
            finished.append(w.wait(timeout))
        except TimeoutError:  # wait() killed it
            assert w.result is not None
            finished.append(w.result)
    return finished


def server_now(dsn: str) -> float:
    """The server's clock (seconds since the epoch): window boundaries on the clock of created_at."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return float(one(c, "SELECT extract(epoch FROM clock_timestamp())::float8")[0])


PICKUP_ROWS = ("SELECT id, extract(epoch FROM created_at)::float8, (result #>> '{}')::float8,"
               "       extract(epoch FROM finished_at)::float8, extract(epoch FROM started_at)::float8"
               "  FROM skiplock.jobs WHERE state = 'done' AND task = 'pickup'")


def pickup_rows(conn: psycopg.Connection[Any], finished_from: float | None = None,
                finished_before: float | None = None) -> list[tuple[int, float, float, float, float]]:
    """(id, created_at, handler start, finished_at, started_at -- the claim transaction's start) of
    done pickup jobs, optionally those finished in
    [from, before) -- an index range on ``jobs_finished_idx``."""
    if finished_from is None or finished_before is None:
        return [tuple(r) for r in conn.execute(PICKUP_ROWS).fetchall()]  # type: ignore[misc]
    return [tuple(r) for r in conn.execute(  # type: ignore[misc]
        PICKUP_ROWS + " AND finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s)",
        [finished_from, finished_before]).fetchall()]


def call_windows(calls: Sequence[tuple[int, int, float, float]]) -> tuple[list[int], list[tuple[int, int, float, float]]]:
    ordered = sorted(calls)
    return [c[0] for c in ordered], ordered


def call_of(job_id: int, firsts: list[int], ordered: list[tuple[int, int, float, float]]) -> tuple[int, int, float, float] | None:
    """The producer call that created ``job_id`` (calls cover disjoint ascending id ranges: one producer)."""
    i = bisect.bisect_right(firsts, job_id) - 1
    if i < 0 or job_id > ordered[i][1]:
        return None
    return ordered[i]


def latencies(rows: Sequence[tuple[int, float, float, float, float]], calls: Sequence[tuple[int, int, float, float]]
              ) -> dict[str, Any]:
    """Pickup latency (handler start − created_at) of ``rows``, and the checks and bounds of the
    module docstring, from the producer's ``calls``."""
    firsts, ordered = call_windows(calls)
    from_insert: list[float] = []
    from_return: list[float] = []
    inside = unmatched = 0
    to_claim: list[float] = []
    claim_to_handler: list[float] = []
    claim_sizes: dict[float, int] = {}
    for job_id, created, started, _finished, claimed in rows:
        from_insert.append(started - created)
        to_claim.append(claimed - created)
        claim_to_handler.append(started - claimed)
        claim_sizes[claimed] = claim_sizes.get(claimed, 0) + 1
        c = call_of(job_id, firsts, ordered)
        if c is None:
            unmatched += 1
            continue
        from_return.append(started - c[3])
        inside += c[2] <= created <= c[3]
    matched = len(rows) - unmatched
    sizes = list(claim_sizes.values())
    per_call = [c[1] - c[0] + 1 for c in ordered]
    return {
        "jobs_per_call": {"p50": percentile(per_call, 50), "p99": percentile(per_call, 99), "max": max(per_call)}
        if per_call else None,
        "latency_ms": summary_ms(from_insert) if from_insert else None,
        "p95_ms": percentile(from_insert, 95) * 1000 if from_insert else None,
        "latency_from_enqueue_return_ms": summary_ms(from_return) if from_return else None,
        "insert_to_claim_ms": summary_ms(to_claim) if to_claim else None,
        "claim_to_handler_ms": summary_ms(claim_to_handler) if claim_to_handler else None,
        "jobs_per_claim": {"p50": percentile(sizes, 50), "p90": percentile(sizes, 90),
                           "mean": len(rows) / len(sizes)} if sizes else None,
        "created_at_inside_call_window": inside / matched if matched else None,
        "jobs_without_producer_call": unmatched,
    }


def capacity(ctx: Context, processes: int, slots: int, n: int, label: str) -> dict[str, Any]:
    """Drain ``n`` prefilled 1 ms jobs with ``processes`` × ``slots`` (the public CLI); as in drain.
    Also its WAL per job: the claim and the done only, as pgbench's transactions (rows inserted before)."""
    with fresh_db(ctx.server, label) as dsn:
        app = make_app(dsn)
        try:
            for start in range(0, n, 50_000):
                app.enqueue_many([("sleep", {"ms": JOB_MS})] * min(50_000, n - start))
        finally:
            app.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("VACUUM ANALYZE skiplock.jobs")
        checkpoint(dsn)
        before = DbCounters.read(dsn, ctx.cpu())
        workers = [ctx.worker(dsn, slots) for _ in range(processes)]
        try:
            finished = [w.wait(timeout=max(120.0, n / 50)) for w in workers]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
        settle(dsn)
        after = DbCounters.read(dsn, ctx.cpu())
        checked = check_drained(dsn, n)
    if any(f.returncode for f in finished):
        raise RuntimeError(f"capacity worker exit codes {[f.returncode for f in finished]}: {finished[0].stderr[-2000:]}")
    return {"jobs": n, "processes": processes, "slots": slots, "throughput": checked["throughput"],
            "span_s": checked["span_s"], "throughput_basis": checked["throughput_basis"],
            # claim + done only (the rows were inserted before): comparable with pgbench's WAL per transaction
            "wal_bytes_per_job": (after.wal_lsn - before.wal_lsn) / n,
            "workers": [worker_summary(f.stderr) for f in finished]}


def queue_depth_on(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(queued, running) jobs right now."""
    queued, running = one(conn, "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'running')"
                                "  FROM skiplock.jobs WHERE state IN ('queued', 'running')")
    return int(queued), int(running)


def queue_depth(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return queue_depth_on(c)


def offered(ctx: Context, label: str, processes: int, slots: int, rate: float, seconds: float, warmup: float,
            drain_timeout: float = 60.0) -> dict[str, Any]:
    """Offer ``rate`` pickup jobs/s to ``processes`` × ``slots`` workers; measure a window of ``seconds``
    after ``warmup``; then let the workers finish what is left and read every job's latency."""
    with fresh_db(ctx.server, label) as dsn:
        producer = Producer(dsn, rate)
        workers = [ctx.worker(dsn, slots, stop_when_empty=False) for _ in range(processes)]
        try:
            wait_for_workers(dsn, processes)
            cpu = ctx.cpu()
            producer.start()
            time.sleep(warmup)
            w0 = server_now(dsn)
            c0, wcpu0 = DbCounters.read(dsn, cpu), sum(w.cpu_now() for w in workers)
            time.sleep(seconds)
            w1 = server_now(dsn)
            c1, wcpu1 = DbCounters.read(dsn, cpu), sum(w.cpu_now() for w in workers)
            backlog = queue_depth(dsn)
            producer.stop()
            deadline = time.monotonic() + drain_timeout
            while sum(queue_depth(dsn)) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = queue_depth(dsn)
            with psycopg.connect(dsn, autocommit=True) as c:
                rows = pickup_rows(c)
        finally:
            try:
                if producer.is_alive():
                    producer.stop()
            finally:
                finished = stop_all(workers)
        settle(dsn)
    window = [r for r in rows if w0 <= r[1] < w1]
    lat = latencies(window, producer.take_calls())
    counters = c0.delta(c1)
    return {
        "processes": processes, "slots": slots, "rate_target": rate, "window_s": w1 - w0,
        "tick_s": producer.tick, "producer_calls": producer.calls_made, "producer_max_jobs_per_tick": producer.max_due,
        "producer_achieved_rate": producer.achieved_rate(),
        "offered_in_window": len(window) / (w1 - w0),
        "completed_in_window": sum(1 for r in rows if w0 <= r[3] < w1) / (w1 - w0),
        "backlog_at_end": {"queued": backlog[0], "running": backlog[1]},
        "not_done_after_drain": {"queued": left[0], "running": left[1]},
        "jobs_in_window": len(window),
        **lat,
        "worker_cores": (wcpu1 - wcpu0) / counters["seconds"],
        "server_cores": None if counters["server_cpu_s"] is None else counters["server_cpu_s"] / counters["seconds"],
        "wal_bytes_per_job_in_window": counters["wal_bytes"] / len(window) if window else None,
        "worker_exits": [f.returncode for f in finished],
        "workers": [summary_of(f.stderr) for f in finished],
    }


def run(ctx: Context) -> list[Figure]:
    z = ctx.sizes
    figures: list[Figure] = []
    for processes, slots in CELLS:
        cell = f"{processes}×{slots}"
        ctx.log(f"load {cell}: capacity, {z.load_capacity_jobs:,} prefilled {JOB_MS:g} ms jobs")
        cap = capacity(ctx, processes, slots, z.load_capacity_jobs, f"load_cap_{processes}x{slots}")
        rate = FRACTION * cap["throughput"]
        ctx.log(f"load {cell}: capacity {cap['throughput']:,.0f} jobs/s; offering {rate:,.0f} jobs/s for "
                f"{z.load_warmup_seconds:g} + {z.load_seconds:g} s")
        r = offered(ctx, f"load_{processes}x{slots}", processes, slots, rate, z.load_seconds, z.load_warmup_seconds)
        r["capacity"] = cap
        ctx.raw[f"load_{processes}x{slots}"] = r
        lat = r["latency_ms"] or {}
        ctx.log(f"load {cell}: {r['jobs_in_window']:,} jobs, p50 {lat.get('p50', float('nan')):.2f} ms, "
                f"p99 {lat.get('p99', float('nan')):.2f} ms, backlog {r['backlog_at_end']}")
        problems = sum(w["problems"] for w in r["workers"])
        s = f"load ({processes} × {slots})"
        figures += [
            Figure(s, f"capacity: drain of {z.load_capacity_jobs:,} prefilled {JOB_MS:g} ms jobs", cap["throughput"],
                   "jobs/s", details={"span_s": cap["span_s"]}),
            Figure(s, f"offered rate in the window ({FRACTION:.0%} of capacity)", r["offered_in_window"], "jobs/s",
                   baseline_or_target=rate, reference="target", goal=">= 0.95",
                   note="a producer that cannot keep up makes the latency figures meaningless",
                   details={"tick_s": r["tick_s"], "max_jobs_per_tick": r["producer_max_jobs_per_tick"]}),
            Figure(s, "completions in the window", r["completed_in_window"], "jobs/s",
                   baseline_or_target=r["offered_in_window"], reference="offered"),
            Figure(s, "pickup latency p50 (insert → handler start)", lat.get("p50"), "ms",
                   baseline_or_target=P50_TARGET_MS, reference="target", goal="<= 1", details=lat),
            Figure(s, "pickup latency p95", r["p95_ms"], "ms"),
            Figure(s, "pickup latency p99", lat.get("p99"), "ms", baseline_or_target=P99_TARGET_MS,
                   reference="target", goal="<= 1"),
            Figure(s, "pickup latency max", lat.get("max"), "ms"),
            Figure(s, "pickup latency p50 from the enqueue call's return (a lower bound)",
                   (r["latency_from_enqueue_return_ms"] or {}).get("p50"), "ms"),
            Figure(s, "pickup latency p99 from the enqueue call's return (a lower bound)",
                   (r["latency_from_enqueue_return_ms"] or {}).get("p99"), "ms",
                   note="the difference to insert → handler start is the insert's own statement and commit",
                   details={"from_enqueue_return_ms": r["latency_from_enqueue_return_ms"],
                            "created_at_inside_call_window": r["created_at_inside_call_window"],
                            "jobs_per_enqueue_call": r["jobs_per_call"]}),
            Figure(s, "pickup split: insert → claim (the claim transaction's start), p50",
                   (r["insert_to_claim_ms"] or {}).get("p50"), "ms", details={"insert_to_claim_ms": r["insert_to_claim_ms"]}),
            Figure(s, "pickup split: claim → handler start (round trips, batch-mates ahead), p50",
                   (r["claim_to_handler_ms"] or {}).get("p50"), "ms",
                   details={"claim_to_handler_ms": r["claim_to_handler_ms"], "jobs_per_claim": r["jobs_per_claim"]}),
            Figure(s, "jobs per claim, p50", (r["jobs_per_claim"] or {}).get("p50"), "jobs",
                   details=r["jobs_per_claim"] or {}),
            Figure(s, "backlog at the end of the window (queued + running)",
                   r["backlog_at_end"]["queued"] + r["backlog_at_end"]["running"], "jobs"),
            Figure(s, "worker log lines reporting a problem", problems, "count", baseline_or_target=0, goal="== 0",
                   goal_on="value", details={"lines": [line for w in r["workers"] for line in w["problem_lines"]]}),
        ]
        if sum(r["not_done_after_drain"].values()):
            figures.append(Figure(s, "jobs not done 60 s after the producer stopped",
                                  sum(r["not_done_after_drain"].values()), "jobs", baseline_or_target=0, goal="== 0",
                                  goal_on="value"))
    return figures
