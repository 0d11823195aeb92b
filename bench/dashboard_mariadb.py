"""The dashboard at scale on MariaDB: bench/dashboard.py's requests (every page and API endpoint, the
job list under each filter), p95 server time with 1,000,000 jobs in the table against the same
request on an empty table, on a private MariaDB this starts and stops (tests/mariadb_server.py).

    python -m bench.dashboard_mariadb [--jobs N] [--requests N]

The rows are made on the server by ``INSERT … SELECT`` over a cross join of digits, 100,000 per
statement, with bench/dashboard.py's mix: 70 % done, 20 % queued (a tenth due later), 7.9 % failed
(four error classes), 2 % cancelled, 300 running (claimed lease); four queues, six tasks, created over
seven days; then ``ANALYZE TABLE``. The dashboard runs in this process (Starlette's TestClient), as
the viewer: bench/dashboard.py's ``measure``. JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .dashboard import ERRORS, QUEUES, TASKS, measure

REPO_ROOT = Path(__file__).resolve().parent.parent
CHUNK = 100_000
DIGITS = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"


def _list(values: list[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)  # the bench's own constants


LOAD_SQL = f"""
INSERT INTO skiplock_jobs (queue, task, args, priority, state, attempts, max_attempts, run_at, created_at,
                           started_at, finished_at, last_error, errors, result, worker, owner, lease_expires_at)
SELECT ELT(1 + MOD(g, 4), {_list(QUEUES)}), ELT(1 + MOD(g, 6), {_list(TASKS)}),
       JSON_OBJECT('user', CONCAT('user-', g), 'n', g, 'note', CASE WHEN MOD(g, 100000) = 42 THEN 'needle-42' END),
       0, st, CASE WHEN st = 'queued' THEN 0 ELSE 1 END, 5,
       CASE WHEN st = 'queued' AND MOD(g, 10) = 0 THEN UTC_TIMESTAMP(6) + INTERVAL 1 DAY ELSE created END,
       created,
       CASE WHEN st <> 'queued' THEN created + INTERVAL 1 SECOND END,
       CASE WHEN st IN ('done', 'failed', 'cancelled') THEN created + INTERVAL 2 SECOND END,
       CASE WHEN st = 'failed' THEN ELT(1 + MOD(g, 4), {_list(ERRORS)}) END, '[]',
       CASE WHEN st = 'done' THEN '{{"ok": true}}' END,
       CASE WHEN st IN ('running', 'done', 'failed') THEN CONCAT('bench-host:', MOD(g, 8), '/', MOD(g, 4)) END,
       CASE WHEN st = 'running' THEN UUID() END,
       CASE WHEN st = 'running' THEN UTC_TIMESTAMP(6) + INTERVAL 1 HOUR END
  FROM (SELECT g,
               CASE WHEN g > %(n)s - %(running)s THEN 'running' WHEN MOD(g, 100) < 70 THEN 'done'
                    WHEN MOD(g, 100) < 90 THEN 'queued' WHEN MOD(g, 100) < 98 THEN 'failed'
                    ELSE 'cancelled' END AS st,
               UTC_TIMESTAMP(6) - INTERVAL FLOOR((%(n)s - g) * 604800000000 / %(n)s) MICROSECOND AS created
          FROM (SELECT %(base)s + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 1 AS g
                  FROM {DIGITS} a, {DIGITS} b, {DIGITS} c, {DIGITS} e, {DIGITS} f) x
         WHERE g <= %(n)s) y
 ORDER BY g
"""


def load(server: Any, database: str, jobs: int, running: int = 300) -> dict[str, Any]:
    t = time.perf_counter()
    with server.connect(database) as c, c.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        for base in range(0, jobs, CHUNK):
            cur.execute(LOAD_SQL, {"n": jobs, "running": running, "base": base})
            c.commit()
        cur.execute("INSERT INTO skiplock_workers (id, name, tasks, queues, host, pid, concurrency, started_at, "
                    "last_seen) SELECT UUID(), CONCAT('bench-host:', d), %s, NULL, 'bench-host', 1000 + d, 8, "
                    f"UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {DIGITS} g WHERE d < 8", (json.dumps(TASKS),))
        cur.execute("INSERT INTO skiplock_audit_log (at, actor, action, target, affected) SELECT UTC_TIMESTAMP(6), "
                    "'operator (bearer)', 'retry', '{\"state\": \"failed\"}', a.d * 10 + b.d "
                    f"FROM {DIGITS} a, {DIGITS} b")
        c.commit()
        cur.execute("ANALYZE TABLE skiplock_jobs")
        cur.fetchall()
        cur.execute("SELECT COUNT(*) FROM skiplock_jobs")
        total = int(cur.fetchone()[0])
    return {"jobs": total, "setup_s": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    opts = parser.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    import mariadb_server  # the tests' private server

    import skiplock

    server = mariadb_server.start()
    out: dict[str, Any] = {"mariadb": server.version, "jobs": opts.jobs, "requests": opts.requests}
    try:
        for label in ("empty", "full"):
            name = mariadb_server.fresh_database(server)
            dsn = "mariadb://" + server.dsn(name)[len("mysql://"):]
            with skiplock.App(dsn) as app:
                app.migrate()
            if label == "full":
                out["setup"] = load(server, name, opts.jobs)
            print(f"measuring {label}", file=sys.stderr, flush=True)
            out[label] = measure(dsn, opts.requests)
    finally:
        server.stop()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
