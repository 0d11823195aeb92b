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

CLAIM_SCRIPT = """\
BEGIN;
SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED \\gset
UPDATE jobs SET state = 'done' WHERE id = :id;
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


def claim_run(ctx: Context, label: str, tx_total: int) -> tuple[int, int, dict[str, Any], dict[str, Any], int]:
    """One pgbench run of the claim protocol in a fresh database: (tx, rows, pgbench result, counters, done)."""
    per_client = max(1, tx_total // CLIENTS)
    tx = per_client * CLIENTS
    rows = tx + tx // 10
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
        result = run_pgbench(ctx, dsn, CLAIM_SCRIPT, ["-c", str(CLIENTS), "-j", str(THREADS), "-t", str(per_client)])
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
    return [
        Figure(s, f"pgbench claim protocol TPS ({CLIENTS} clients, -M prepared)", tps, "tx/s",
               note="the reference for drain and many-workers ratios (mean of the runs when measured twice)"),
        Figure(s, "pgbench server CPU per transaction", per_job_us(delta["server_cpu_s"], tx), "µs/tx"),
        Figure(s, "pgbench client CPU per transaction", per_job_us(result["client_cpu_s"], tx), "µs/tx"),
        Figure(s, "pgbench WAL per transaction", delta["wal_bytes"] / tx, "bytes/tx"),
    ]
