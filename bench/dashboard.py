"""The dashboard at scale: p95 server time of every page and API endpoint with 1,000,000 jobs in the
table (mixed states), against the same request on an empty table (issue 13: goal <= 100 ms p95 at 1M).

    python -m bench --only dashboard          # 1,000,000 jobs (--quick: 100,000)
    python -m bench.dashboard --dsn DSN       # on its own, against an existing server (a database of its own)

The rows are inserted by one ``INSERT ... SELECT generate_series`` on the server (not through Python):
70 % done, 20 % queued (a tenth of them due later), 7.9 % failed (four error classes), 2 % cancelled
and a few hundred running (claimed lease), over four queues and six tasks, created over the last
seven days (so about 1/168 of the finished jobs finished in the last hour: the throughput chart's
window); then ``VACUUM ANALYZE``, as autovacuum would leave a table that size. A few worker rows,
audit rows and outbox messages make the other pages non-empty.

The dashboard runs in this process (Starlette's TestClient: the real ASGI app, the real database, no
HTTP server), as the viewer; each request is made ``REQUESTS`` times after one warm-up, and the
figure is the p95 of the wall time of the request (server time: the client's share is microseconds).
The empty-table figures use a fresh database with the schema only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import psycopg

from .common import Context, Figure, fresh_db

GOAL_MS = 100.0
REQUESTS = 20
TOKEN = "bench-dashboard-viewer-token-0123456789"

# (name, path): every page and API endpoint, and the job list under each of its filters.
# {job}: a job id that exists; {since}: an hour ago (ISO 8601).
REQUESTS_MADE = [
    ("overview", "/"),
    ("overview fragment", "/?fragment=1"),
    ("api overview", "/api/overview"),
    ("jobs", "/jobs"),
    ("jobs state=failed", "/jobs?state=failed"),
    ("jobs state=queued", "/jobs?state=queued"),
    ("jobs state=running", "/jobs?state=running"),
    ("jobs queue", "/jobs?queue=reports"),
    ("jobs task", "/jobs?task=send_email"),
    ("jobs error class", "/jobs?state=failed&error_class=TimeoutError"),
    ("jobs created since", "/jobs?since={since}"),
    ("jobs args text (rare)", "/jobs?args=needle-42"),
    ("jobs args text (common)", "/jobs?args=user"),
    ("job detail", "/jobs/{job}"),
    ("running", "/running"),
    ("workers", "/workers"),
    ("queues", "/queues"),
    ("cron", "/cron"),
    ("outbox", "/outbox"),
    ("audit log", "/audit"),
]

QUEUES = ["default", "emails", "reports", "webhooks"]
TASKS = ["send_email", "render_report", "deliver_webhook", "resize_image", "sync_account", "noop"]
ERRORS = ["TimeoutError: upstream took too long", "ValueError: bad input", "gave up after 5 attempts",
          "ConnectionError: reset by peer"]

LOAD_SQL = """
INSERT INTO skiplock.jobs (queue, task, args, priority, state, attempts, max_attempts, run_at, created_at,
                           started_at, finished_at, last_error, result, worker, owner, lease_expires_at)
SELECT (%(queues)s::text[])[1 + g %% 4], (%(tasks)s::text[])[1 + g %% 6],
       jsonb_build_object('user', 'user-' || g, 'n', g, 'note', CASE WHEN g %% 100000 = 42 THEN 'needle-42' END),
       0, s.state,
       CASE WHEN s.state IN ('queued') THEN 0 ELSE 1 END, 5,
       CASE WHEN s.state = 'queued' AND g %% 10 = 0 THEN now() + interval '1 day' ELSE c.created END,
       c.created,
       CASE WHEN s.state <> 'queued' THEN c.created + interval '1 second' END,
       CASE WHEN s.state IN ('done', 'failed', 'cancelled') THEN c.created + interval '2 seconds' END,
       CASE WHEN s.state = 'failed' THEN (%(errors)s::text[])[1 + g %% 4] END,
       CASE WHEN s.state = 'done' THEN '{"ok": true}'::jsonb END,
       CASE WHEN s.state IN ('running', 'done', 'failed') THEN 'bench-host:' || (g %% 8) || '/' || (g %% 4) END,
       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END
  FROM generate_series(1, %(n)s) g,
       LATERAL (SELECT now() - (%(n)s - g) * (interval '7 days' / %(n)s) AS created) c,
       LATERAL (SELECT CASE WHEN g > %(n)s - %(running)s THEN 'running'
                            WHEN g %% 100 < 70 THEN 'done'
                            WHEN g %% 100 < 90 THEN 'queued'
                            WHEN g %% 100 < 98 THEN 'failed'
                            ELSE 'cancelled' END AS state) s
"""


def load(dsn: str, jobs: int, running: int = 300) -> dict[str, Any]:
    """Fill the jobs table (see the module docstring) and the small tables; returns the set-up's figures."""
    t = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(LOAD_SQL, {"n": jobs, "running": running, "queues": QUEUES, "tasks": TASKS, "errors": ERRORS})
        c.execute("INSERT INTO skiplock.workers (id, name, tasks, queues, host, pid, concurrency)"
                  " SELECT gen_random_uuid(), 'bench-host:' || g, %s, NULL, 'bench-host', 1000 + g, 8"
                  "   FROM generate_series(0, 7) g", [TASKS])
        c.execute("INSERT INTO skiplock.audit_log (actor, action, target, affected)"
                  " SELECT 'operator (bearer)', 'retry', '{\"state\": \"failed\"}'::jsonb, g FROM generate_series(1, 200) g")
        c.execute("VACUUM ANALYZE skiplock.jobs")
        total = c.execute("SELECT count(*), pg_total_relation_size('skiplock.jobs') FROM skiplock.jobs").fetchone()
    return {"jobs": total[0] if total else None, "table_and_index_bytes": total[1] if total else None,
            "setup_s": round(time.perf_counter() - t, 1)}


def measure(dsn: str, requests: int = REQUESTS) -> dict[str, dict[str, float]]:
    """p95 (and median, max) in ms of every request of REQUESTS_MADE on the database ``dsn``."""
    from datetime import datetime, timedelta, timezone

    from starlette.testclient import TestClient

    import skiplock
    from skiplock.dashboard import create_app

    from skiplock.readmodel import JobFilter

    app = skiplock.App(dsn)
    try:  # the newest failed job (any backend: through the read model)
        failed = app.read_model.find_jobs(JobFilter(state="failed"), limit=1).items
        job = failed[0].id if failed else 1
        since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat(timespec="seconds")
        web = create_app(app, token=TOKEN)
        out: dict[str, dict[str, float]] = {}
        with TestClient(web, headers={"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}) as client:
            for name, path in REQUESTS_MADE:
                url = path.format(job=job, since=since.replace("+", "%2B"))
                times = []
                for i in range(requests + 1):
                    t0 = time.perf_counter()
                    r = client.get(url)
                    elapsed = (time.perf_counter() - t0) * 1000
                    if r.status_code not in (200, 404):
                        raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
                    if i:  # the first request warms the pool and the caches
                        times.append(elapsed)
                times.sort()
                out[name] = {"p95_ms": round(times[max(0, int(round(0.95 * len(times))) - 1)], 1),
                             "median_ms": round(statistics.median(times), 1), "max_ms": round(times[-1], 1)}
        return out
    finally:
        app.close()


def run(ctx: Context) -> list[Figure]:
    jobs = 100_000 if ctx.sizes.backlog_large < 1_000_000 else 1_000_000  # --quick: a tenth
    with fresh_db(ctx.server, "dashboard_empty") as dsn:
        ctx.log("dashboard: every page on an empty table")
        empty = measure(dsn)
    with fresh_db(ctx.server, "dashboard") as dsn:
        ctx.log(f"dashboard: loading {jobs:,} jobs")
        setup = load(dsn, jobs)
        ctx.log(f"dashboard: loaded in {setup['setup_s']} s; every page {REQUESTS} times")
        full = measure(dsn)
    ctx.raw["dashboard"] = {"setup": setup, "empty": empty, "full": full}
    return [Figure("dashboard", f"{name} p95, {jobs:,} jobs", full[name]["p95_ms"], "ms",
                   baseline_or_target=GOAL_MS, reference=f"goal {GOAL_MS:.0f} ms (empty table: "
                                                         f"{empty[name]['p95_ms']} ms)",
                   goal="<= 1", details={"full": full[name], "empty": empty[name]})
            for name, _ in REQUESTS_MADE]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a database with the skiplock schema (its jobs table is filled)")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--no-load", action="store_true", help="measure the database as it is")
    opts = parser.parse_args(argv)
    setup = None if opts.no_load else load(opts.dsn, opts.jobs)
    print(json.dumps({"setup": setup, "results": measure(opts.dsn)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
