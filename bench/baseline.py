"""The pgbench baseline: the seed's one-job-per-transaction claim protocol, 16 clients, prepared statements.

The table is ``jobs(id bigint primary key, state text)`` plus a partial index on the queued ids, with
the storage parameters of skiplock's own jobs table (fillfactor 90, eager autovacuum): the same
physical design as skiplock's ``jobs_claim_any_idx`` and table, so the baseline measures the protocol
and not a worse layout (without the partial index every claim walks the primary key past all the
rows already done: about 25 % slower at 20,000 rows on the reference machine). Each transaction is

    BEGIN;
    SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;
    UPDATE jobs SET state = 'done' WHERE id = :id;
    COMMIT;

There are 10 % more rows than transactions, so every transaction finds a row, and the run checks
afterwards that exactly the expected number of rows is done.

The batched ceiling: the same protocol with ``BATCH_ROWS`` (50) rows per transaction, on the same
table and clients -- a claim of 50 and one UPDATE of their ids, the shape of skiplock's batches (one
claim statement, one finishing write over an array of ids):

    BEGIN;
    SELECT array_agg(id) AS ids FROM (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id
                                      LIMIT 50 FOR UPDATE SKIP LOCKED) c;
    UPDATE jobs SET state = 'done' WHERE id = ANY(:ids);
    COMMIT;

Its rows per second are what a worker that batches could reach with nothing but the protocol: the
drain's second reference (a goal of at least half of it). It is run with 1, 4 and 16 clients
(``BATCHED_CLIENTS``) and the best is the ceiling: with 50 rows locked per transaction, every other
client's claim steps over them all, so more clients are not always faster (measured here: 44,000 /
57,000 / 47,000 rows/s with 1 / 4 / 16 clients). Each run claims ``Sizes.batched_rows`` rows (100,000:
runs of 20,000 rows lasted under half a second and moved by 2 x from one to the next); each client
runs the same number of transactions and every transaction must find 50 rows (there are 10 % more),
checked afterwards.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Sequence

import psycopg

from .common import Child, Context, DbCounters, Figure, checkpoint, fresh_db, one, per_job_us, settle

CLIENTS = 16
THREADS = 2
BATCH_ROWS = 50  # rows per transaction of the batched ceiling
BATCHED_CLIENTS = (1, 4, 16)  # the ceiling is the best of these

CLAIM_SCRIPT = """\
BEGIN;
SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED \\gset
UPDATE jobs SET state = 'done' WHERE id = :id;
COMMIT;
"""


BATCHED_SCRIPT = f"""\
BEGIN;
SELECT array_agg(id) AS ids FROM (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT {BATCH_ROWS} FOR UPDATE SKIP LOCKED) c \\gset
UPDATE jobs SET state = 'done' WHERE id = ANY(:ids::bigint[]);
COMMIT;
"""


def run_pgbench(ctx: Context, dsn: str, script: str, args: Sequence[str], timeout: float = 600,
                log_dir: Path | None = None) -> dict[str, Any]:
    """Run pgbench with ``script`` against ``dsn``; returns tps, latency, counts and its own CPU."""
    with tempfile.TemporaryDirectory(prefix="skiplock-pgbench-") as tmp:
        path = Path(tmp) / "script.sql"
        path.write_text(script)
        cwd = log_dir or Path(tmp)
        child = Child([str(ctx.server.pgbench), "-n", "-M", "prepared", "-f", str(path), *args, dsn], cwd=cwd)
        done = child.wait(timeout)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed (exit {done.returncode}):\n{out[-3000:]}")

    def grab(pattern: str) -> float | None:
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None

    processed = re.search(r"number of transactions actually processed: (\d+)", out)
    return {
        "tps": grab(r"tps = ([0-9.]+) \(without initial connection time\)"),
        "latency_avg_ms": grab(r"latency average = ([0-9.]+) ms"),
        "failed": int(grab(r"number of failed transactions: (\d+)") or 0),
        "processed": int(processed.group(1)) if processed else None,
        "client_cpu_s": done.cpu_s,
        "wall_s": done.wall_s,
        "output": out.strip().splitlines()[-12:],
    }


def claim_run(ctx: Context, label: str, tx_total: int, batch: int = 1,
              clients: int = CLIENTS) -> tuple[int, int, dict[str, Any], dict[str, Any], int]:
    """One pgbench run of the claim protocol in a fresh database, ``batch`` rows per transaction (1 or
    BATCH_ROWS), by ``clients`` clients: (tx, rows, pgbench result, counters, rows done)."""
    per_client = max(1, tx_total // clients)
    tx = per_client * clients
    rows = (tx + tx // 10) * batch
    with fresh_db(ctx.server, label, migrate=False) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL) WITH (fillfactor = 90, "
                      "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05)")
            c.execute("INSERT INTO jobs SELECT g, 'queued' FROM generate_series(1, %s) g", [rows])
            c.execute("CREATE INDEX jobs_queued_idx ON jobs (id) WHERE state = 'queued'")
            c.execute("VACUUM ANALYZE jobs")
        checkpoint(dsn)
        cpu = ctx.cpu()
        before = DbCounters.read(dsn, cpu)
        script = CLAIM_SCRIPT if batch == 1 else BATCHED_SCRIPT
        result = run_pgbench(ctx, dsn, script, ["-c", str(clients), "-j", str(min(THREADS, clients)),
                                                "-t", str(per_client)])
        settle(dsn)
        after = DbCounters.read(dsn, cpu)
        with psycopg.connect(dsn) as c:
            done = one(c, "SELECT count(*) FROM jobs WHERE state = 'done'")[0]
    return tx, rows, result, before.delta(after), done


def run(ctx: Context, label: str = "baseline") -> list[Figure]:
    if not ctx.raw.get("baseline_warmup_tps"):
        # An unreported short run first: on a new server the first run was slower in several trials
        # on the reference machine (new processes, cold caches, the first WAL segment switches).
        warm = claim_run(ctx, "warmup", max(CLIENTS, ctx.sizes.baseline_tx // 4))
        ctx.raw["baseline_warmup_tps"] = warm[2]["tps"]
    ctx.log(f"pgbench: {ctx.sizes.baseline_tx:,} claim transactions, {CLIENTS} clients")
    tx, rows, result, delta, done = claim_run(ctx, label, ctx.sizes.baseline_tx)
    if done != tx or result["failed"] or result["processed"] != tx:
        raise RuntimeError(f"pgbench baseline: {done} rows done, {result['processed']} processed, "
                           f"{result['failed']} failed; expected {tx}")
    tps = float(result["tps"])
    ctx.raw[label] = {"transactions": tx, "clients": CLIENTS, "rows": rows, "pgbench": result, "counters": delta}
    # references for the other scenarios: the mean over the baseline runs of this benchmark run
    runs = ctx.raw.setdefault("baseline_runs", [])
    runs.append({"baseline.claim_tps": tps,
                 "baseline.server_cpu_us": per_job_us(delta["server_cpu_s"], tx),
                 "baseline.client_cpu_us": per_job_us(result["client_cpu_s"], tx),
                 "baseline.wal_bytes": delta["wal_bytes"] / tx})
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            ctx.refs[key] = sum(values) / len(values)
    ctx.log(f"pgbench: {tps:,.0f} tps")
    s = "baseline" if label == "baseline" else "baseline (end)"
    batched = []
    if label == "baseline":  # the batched ceiling once per run (the drain's second reference)
        batched = batched_run(ctx)
    return batched + [
        Figure(s, f"pgbench claim protocol TPS ({CLIENTS} clients, -M prepared)", tps, "tx/s",
               note="the reference for drain and many-workers ratios (mean of the runs when measured twice)"),
        Figure(s, "pgbench server CPU per transaction", per_job_us(delta["server_cpu_s"], tx), "µs/tx"),
        Figure(s, "pgbench client CPU per transaction", per_job_us(result["client_cpu_s"], tx), "µs/tx"),
        Figure(s, "pgbench WAL per transaction", delta["wal_bytes"] / tx, "bytes/tx"),
    ]


def batched_run(ctx: Context) -> list[Figure]:
    """The batched ceiling (module docstring): BATCH_ROWS rows per transaction, ``Sizes.batched_rows``
    rows per run, the best of BATCHED_CLIENTS. Sets ``baseline.batched_rows_per_s``."""
    runs: dict[int, dict[str, Any]] = {}
    for clients in BATCHED_CLIENTS:
        tx_total = max(clients, ctx.sizes.batched_rows // BATCH_ROWS)
        ctx.log(f"pgbench: {tx_total * BATCH_ROWS:,} rows claimed {BATCH_ROWS} per transaction, {clients} client(s)")
        tx, rows, result, delta, done = claim_run(ctx, f"baseline_batched_{clients}", tx_total, batch=BATCH_ROWS,
                                                  clients=clients)
        if done != tx * BATCH_ROWS or result["failed"] or result["processed"] != tx:
            raise RuntimeError(f"pgbench batched baseline: {done} rows done, {result['processed']} processed, "
                               f"{result['failed']} failed; expected {tx} transactions of {BATCH_ROWS}")
        runs[clients] = {"transactions": tx, "rows": rows, "rows_per_s": float(result["tps"]) * BATCH_ROWS,
                         "server_cpu_us_per_row": per_job_us(delta["server_cpu_s"], tx * BATCH_ROWS),
                         "wal_bytes_per_row": delta["wal_bytes"] / (tx * BATCH_ROWS), "pgbench": result}
    best = max(runs, key=lambda c: runs[c]["rows_per_s"])
    ctx.raw["baseline_batched"] = {"rows_per_transaction": BATCH_ROWS, "best_clients": best, "runs": runs}
    ctx.refs["baseline.batched_rows_per_s"] = runs[best]["rows_per_s"]
    ctx.log(f"pgbench: {runs[best]['rows_per_s']:,.0f} rows/s in transactions of {BATCH_ROWS} ({best} client(s))")
    return [Figure("baseline", f"pgbench claim protocol, {BATCH_ROWS} rows per transaction (best of "
                               f"{', '.join(map(str, BATCHED_CLIENTS))} clients: {best})",
                   runs[best]["rows_per_s"], "rows/s", note="the batched ceiling: the drain's second reference",
                   details={str(c): round(r["rows_per_s"]) for c, r in runs.items()}),
            Figure("baseline", f"pgbench server CPU per row, {BATCH_ROWS} per transaction ({best} client(s))",
                   runs[best]["server_cpu_us_per_row"], "µs/row"),
            Figure("baseline", f"pgbench WAL per row, {BATCH_ROWS} per transaction ({best} client(s))",
                   runs[best]["wal_bytes_per_row"], "bytes/row")]
