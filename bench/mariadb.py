"""``python -m bench --only mariadb`` (or ``python -m bench.mariadb``): skiplock on MariaDB against the
server's own load tool, in one run, on a private MariaDB it starts and stops (tests/mariadb_server.py).

Figures, each a ratio against a baseline measured in the same run on the same server:

- ``drain``: 20,000 no-op jobs drained by one ``skiplock worker`` process with 8 slots, in jobs per
  second from the first job's start to the last job's finish (the database's own timestamps: worker
  start-up is not counted), against the **mariadb-slap baseline** at the same concurrency (8 clients):
  the raw protocol, one job per transaction,
  ``BEGIN; SELECT id INTO @id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP
  LOCKED; UPDATE jobs SET state = 'done' WHERE id = @id; COMMIT`` (each client at READ COMMITTED),
  on a table with the claim's index and 10 % more rows than transactions. Goal: ≥ 1.0 ×;
- ``8x8``: 8 worker processes × 8 slots drain 20,000 jobs, against mariadb-slap at 64 clients; and the
  deadlocks: how many InnoDB detected (``Innodb_deadlocks``: rolled back and retried inside the
  backend) and how many *surfaced* -- a 1213 in a worker's log or a job's errors. Goal: 0 surfaced;
- ``enqueue``: ``app.enqueue`` one job per call (one transaction each) against a raw single-row
  INSERT per transaction with PyMySQL, and ``app.enqueue_many`` of 20,000 jobs against a raw
  multi-row INSERT (PyMySQL's ``executemany``) of the same rows.

JSON goes to ``bench/results/mariadb-latest.json`` (``--out``) and stdout's table. Run it under the
shared lock, exclusively: ``flock -x /tmp/skiplock-bench.lock .venv/bin/python -m bench --only mariadb``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FULL = {"drain_jobs": 20_000, "enqueue_single": 3_000, "enqueue_many": 20_000}
QUICK = {"drain_jobs": 2_000, "enqueue_single": 500, "enqueue_many": 2_000}
SLAP_TRANSACTION = ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;BEGIN;"
                    "SELECT id INTO @id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;"
                    "UPDATE jobs SET state = 'done' WHERE id = @id;COMMIT")
SLAP_STATEMENTS = 5  # statements per transaction above (mariadb-slap counts statements)


def log(msg: str, t0: list[float] = [time.perf_counter()]) -> None:  # noqa: B006 - the run's start
    print(f"{time.perf_counter() - t0[0]:6.1f}s {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, server: Any):
        self.server = server

    def database(self, prefix: str) -> tuple[str, str]:
        """A fresh database: (its name, a mariadb:// DSN for skiplock)."""
        name = f"bench_{prefix}_{os.getpid()}"
        with self.server.connect() as c, c.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")  # names made here: [a-z0-9_]
            cur.execute(f"CREATE DATABASE `{name}`")
        return name, "mariadb://" + self.server.dsn(name)[len("mysql://"):]

    def drop(self, name: str) -> None:
        with self.server.connect() as c, c.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")

    def one(self, database: str | None, query: str, params: Any = None) -> Any:
        with self.server.connect(database) as c, c.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchone()

    def deadlocks(self) -> int:
        return int(self.one(None, "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")[1])

    # ---- the mariadb-slap baseline -------------------------------------------------------------

    def slap(self, transactions: int, clients: int) -> dict[str, Any]:
        name, _ = self.database("slap")
        try:
            with self.server.connect(name) as c, c.cursor() as cur:
                cur.execute("CREATE TABLE jobs (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, "
                            "KEY claim (state, id)) ENGINE=InnoDB")
                cur.execute("INSERT INTO jobs SELECT seq, 'queued' FROM seq_1_to_%d" % int(transactions * 1.1))
            slap = shutil.which("mariadb-slap") or "/usr/bin/mariadb-slap"
            # the password through the environment (MYSQL_PWD), never argv
            argv = [slap, "--no-defaults", "-h", "127.0.0.1", "-P", str(self.server.port), "-u", "skiplock",
                    f"--create-schema={name}", "--no-drop", "--delimiter=;", f"--concurrency={clients}",
                    "--iterations=1", f"--number-of-queries={transactions * SLAP_STATEMENTS}",
                    f"--query={SLAP_TRANSACTION}"]
            t = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1200,
                                  env=dict(os.environ, MYSQL_PWD=self.server.password))
            wall = time.perf_counter() - t
            if done.returncode != 0:
                raise RuntimeError(f"mariadb-slap failed: {done.stderr[-1000:]}")
            m = re.search(r"Average number of seconds to run all queries: ([0-9.]+)", done.stdout)
            if m is None:
                raise RuntimeError(f"mariadb-slap printed no average time: {done.stdout[-1000:]}")
            seconds = float(m.group(1))
            finished = int(self.one(name, "SELECT COUNT(*) FROM jobs WHERE state = 'done'")[0])
            return {"clients": clients, "transactions": finished, "seconds": seconds, "wall_s": wall,
                    "tps": finished / seconds}
        finally:
            self.drop(name)

    # ---- skiplock ------------------------------------------------------------------------------

    def drain(self, jobs: int, processes: int, slots: int) -> dict[str, Any]:
        import skiplock

        name, dsn = self.database(f"drain{processes}x{slots}")
        try:
            app = skiplock.App(dsn)
            app.migrate()
            app.enqueue_many([("noop", {}) for _ in range(jobs)])
            app.close()
            deadlocks_before = self.deadlocks()
            logs = [Path(f"/tmp/skiplock-bench-mariadb-{os.getpid()}-{i}.log") for i in range(processes)]
            env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
            env.update(SKIPLOCK_DSN=dsn, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]))
            procs = []
            for path in logs:
                with open(path, "wb") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "skiplock", "--quiet", "worker", "--app", "bench.tasks:app",
                         "--concurrency", str(slots), "--poll-interval", "0.05", "--no-maintenance",
                         "--log-level", "WARNING"], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 900
            try:
                while time.monotonic() < deadline:
                    left = int(self.one(name, "SELECT COUNT(*) FROM skiplock_jobs WHERE state <> 'done'")[0])
                    if left == 0 or any(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.2)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                for p in procs:
                    try:
                        p.wait(60)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            done, failed, micros, errors_1213 = self.one(
                name, "SELECT SUM(state = 'done'), SUM(state = 'failed'), "
                      "TIMESTAMPDIFF(MICROSECOND, MIN(started_at), MAX(finished_at)), "
                      "SUM(errors LIKE '%%1213%%' OR last_error LIKE '%%1213%%') FROM skiplock_jobs")
            texts = [log.read_text(errors="replace") for log in logs]
            for log in logs:
                log.unlink(missing_ok=True)
            surfaced_logs = sum(len(re.findall(r"\b1213\b|Deadlock found", t)) for t in texts)
            return {"processes": processes, "slots": slots, "jobs": jobs, "done": int(done or 0),
                    "failed": int(failed or 0), "seconds": (micros or 0) / 1e6,
                    "jobs_per_s": int(done or 0) / ((micros or 1) / 1e6),
                    "deadlocks_detected_by_innodb": self.deadlocks() - deadlocks_before,
                    "deadlocks_surfaced": surfaced_logs + int(errors_1213 or 0),
                    "worker_log_tail": [t[-500:] for t in texts if t.strip()][:2]}
        finally:
            self.drop(name)

    def enqueue(self, single: int, many: int) -> dict[str, Any]:
        import pymysql

        import skiplock

        name, dsn = self.database("enqueue")
        try:
            app = skiplock.App(dsn)
            app.migrate()
            app.enqueue("noop", {})  # connect and warm up outside the timing
            t = time.perf_counter()
            for _ in range(single):
                app.enqueue("noop", {})
            single_rate = single / (time.perf_counter() - t)
            t = time.perf_counter()
            app.enqueue_many([("noop", {}) for _ in range(many)])
            many_rate = many / (time.perf_counter() - t)
            app.close()
            with self.server.connect(name) as c, c.cursor() as cur:
                cur.execute("CREATE TABLE raw_jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(190) NOT NULL, "
                            "task VARCHAR(190) NOT NULL, args LONGTEXT NOT NULL, state VARCHAR(16) NOT NULL, "
                            "run_at DATETIME(6) NOT NULL, KEY claim (state, queue, id)) ENGINE=InnoDB")
            # all values bound (PyMySQL's executemany makes one multi-row INSERT only of a plain VALUES list)
            insert = "INSERT INTO raw_jobs (queue, task, args, state, run_at) VALUES (%s, %s, %s, %s, %s)"
            now = datetime.now(timezone.utc).replace(tzinfo=None)
            with self.server.connect(name) as c, c.cursor() as cur:
                assert isinstance(c, pymysql.connections.Connection)
                t = time.perf_counter()
                for _ in range(single):
                    cur.execute(insert, ("default", "noop", "{}", "queued", now))  # autocommit: one transaction each
                raw_single = single / (time.perf_counter() - t)
                t = time.perf_counter()
                c.begin()
                cur.executemany(insert, [("default", "noop", "{}", "queued", now)] * many)  # one multi-row INSERT (chunked)
                c.commit()
                raw_many = many / (time.perf_counter() - t)
            return {"enqueue_per_s": single_rate, "raw_insert_per_s": raw_single,
                    "enqueue_many_per_s": many_rate, "raw_multirow_insert_per_s": raw_many}
        finally:
            self.drop(name)


def run(quick: bool = False, out: Path | None = None) -> int:
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    import mariadb_server  # the tests' private server

    sizes = QUICK if quick else FULL
    n = sizes["drain_jobs"]
    started = datetime.now(timezone.utc)
    log("starting a private MariaDB")
    server = mariadb_server.start()
    b = Bench(server)
    raw: dict[str, Any] = {}
    try:
        log(f"MariaDB {server.version}: mariadb-slap baseline, 8 clients, {n} transactions")
        raw["slap_8"] = b.slap(n, 8)
        log(f"skiplock drain: 1 process x 8 slots, {n} no-op jobs")
        raw["drain_1x8"] = b.drain(n, 1, 8)
        log(f"mariadb-slap baseline, 64 clients, {n} transactions")
        raw["slap_64"] = b.slap(n, 64)
        log(f"skiplock 8 x 8: 8 processes x 8 slots, {n} no-op jobs")
        raw["drain_8x8"] = b.drain(n, 8, 8)
        log("enqueue rates")
        raw["enqueue"] = b.enqueue(sizes["enqueue_single"], sizes["enqueue_many"])
        log("mariadb-slap baseline again, 8 clients (the machine's drift)")
        raw["slap_8_end"] = b.slap(n, 8)
    finally:
        server.stop()
    d1, d8, e = raw["drain_1x8"], raw["drain_8x8"], raw["enqueue"]
    figures = [
        {"name": "drain 1x8 / mariadb-slap 8 clients", "value": d1["jobs_per_s"] / raw["slap_8"]["tps"], "unit": "x",
         "goal": ">= 1.0", "detail": f"{d1['jobs_per_s']:,.0f} vs {raw['slap_8']['tps']:,.0f} jobs/s"},
        {"name": "8x8 workers / mariadb-slap 64 clients", "value": d8["jobs_per_s"] / raw["slap_64"]["tps"],
         "unit": "x", "detail": f"{d8['jobs_per_s']:,.0f} vs {raw['slap_64']['tps']:,.0f} jobs/s"},
        {"name": "8x8 deadlocks surfacing to users", "value": d8["deadlocks_surfaced"], "unit": "", "goal": "0",
         "detail": f"{d8['deadlocks_detected_by_innodb']} detected by InnoDB and retried inside the backend; "
                   f"{d8['failed']} job(s) failed"},
        {"name": "enqueue (one per call) / raw INSERT per transaction",
         "value": e["enqueue_per_s"] / e["raw_insert_per_s"], "unit": "x",
         "detail": f"{e['enqueue_per_s']:,.0f} vs {e['raw_insert_per_s']:,.0f} jobs/s"},
        {"name": "enqueue_many / raw multi-row INSERT", "value": e["enqueue_many_per_s"] / e["raw_multirow_insert_per_s"],
         "unit": "x", "detail": f"{e['enqueue_many_per_s']:,.0f} vs {e['raw_multirow_insert_per_s']:,.0f} jobs/s"},
        {"name": "mariadb-slap drift, end run / start run", "value": raw["slap_8_end"]["tps"] / raw["slap_8"]["tps"],
         "unit": "x", "detail": "how much the machine's capacity moved during the run"},
    ]
    result = {"meta": {"started_at": started.isoformat(timespec="seconds"), "quick": quick, "sizes": sizes,
                       "server": f"MariaDB {server.version}", "cpus": os.cpu_count(),
                       "python": platform.python_version(), "load_average_end": os.getloadavg()},
              "figures": figures, "raw": raw}
    path = out or REPO_ROOT / "bench" / "results" / "mariadb-latest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for f in figures:
        print(f"{f['name']:<55} {f['value']:>8.2f} {f['unit']:<2} {f.get('goal', ''):<7} {f['detail']}")
    print(f"JSON: {path}")
    ok = d1["done"] == n and d8["done"] == n and d8["deadlocks_surfaced"] == 0
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mariadb", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--out", help="JSON output path [bench/results/mariadb-latest.json]")
    args = p.parse_args(argv)
    return run(args.quick, Path(args.out) if args.out else None)


if __name__ == "__main__":
    raise SystemExit(main())
