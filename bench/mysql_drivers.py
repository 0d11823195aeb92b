"""``python -m bench.mysql_drivers``: which MySQL/MariaDB driver for skiplock's MySQL backend, measured.

For each driver that imports (PyMySQL, mysqlclient (``MySQLdb``), MariaDB Connector/Python
(``mariadb``), and the asyncio ones aiomysql and asyncmy), on one connection over TCP to the same
server, one after another:

- ``select1_us``: the round trip of ``SELECT 1`` (fetching the row), median and p99 in microseconds;
- ``claim_tps``: claim transactions per second, one job each, the raw protocol the backend runs:
  ``BEGIN; SELECT id FROM jobs WHERE state='queued' ORDER BY priority, id LIMIT 1 FOR UPDATE SKIP
  LOCKED; UPDATE jobs SET state='done' WHERE id=%s; COMMIT`` (READ COMMITTED), on a table of
  ``--jobs`` queued rows.

Prints JSON. With no ``--dsn`` it starts the tests' private MariaDB (tests/mariadb_server.py) and
stops it after. Run under the shared lock: ``flock -x /tmp/skiplock-bench.lock .venv/bin/python -m
bench.mysql_drivers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

SETUP = [
    "DROP TABLE IF EXISTS bench_jobs",
    "CREATE TABLE bench_jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, state VARCHAR(16) NOT NULL, "
    "priority INT NOT NULL DEFAULT 0, KEY claim (state, priority, id)) ENGINE=InnoDB",
]
CLAIM = ("SELECT id FROM bench_jobs WHERE state = 'queued' ORDER BY priority, id LIMIT 1 "
         "FOR UPDATE SKIP LOCKED")
DONE = "UPDATE bench_jobs SET state = 'done' WHERE id = %s"


def _params(dsn: str) -> dict[str, Any]:
    u = urlsplit(dsn)
    return {"host": u.hostname or "127.0.0.1", "port": u.port or 3306, "user": unquote(u.username or ""),
            "password": unquote(u.password or ""), "database": u.path.lstrip("/")}


def _fill(cur: Any, jobs: int) -> None:
    for sql in SETUP:
        cur.execute(sql)
    cur.execute("INSERT INTO bench_jobs (state) SELECT 'queued' FROM seq_1_to_%d" % jobs)  # MariaDB's SEQUENCE engine


def _sync_driver(name: str) -> Callable[[dict[str, Any]], Any] | None:
    try:
        if name == "pymysql":
            import pymysql

            return lambda p: pymysql.connect(host=p["host"], port=p["port"], user=p["user"], password=p["password"],
                                             database=p["database"], autocommit=True)
        if name == "mysqlclient":
            import MySQLdb

            return lambda p: _autocommit(MySQLdb.connect(host=p["host"], port=p["port"], user=p["user"],
                                                         password=p["password"], database=p["database"]))
        if name == "mariadb":
            import mariadb

            return lambda p: _autocommit(mariadb.connect(host=p["host"], port=p["port"], user=p["user"],
                                                         password=p["password"], database=p["database"]))
    except ImportError:
        return None
    raise ValueError(name)


def _autocommit(conn: Any) -> Any:
    conn.autocommit(True) if callable(getattr(conn, "autocommit", None)) else setattr(conn, "autocommit", True)
    return conn


def measure_sync(connect: Callable[[], Any], rounds: int, claims: int) -> dict[str, Any]:
    conn = connect()
    cur = conn.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    for _ in range(200):
        cur.execute("SELECT 1"); cur.fetchall()
    times = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        cur.execute("SELECT 1")
        cur.fetchall()
        times.append((time.perf_counter_ns() - t) / 1000)
    t0 = time.perf_counter()
    done = 0
    for _ in range(claims):
        cur.execute("BEGIN")
        cur.execute(CLAIM)
        row = cur.fetchone()
        if row is None:
            cur.execute("COMMIT")
            break
        cur.execute(DONE, (row[0],))
        cur.execute("COMMIT")
        done += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    return _figures(times, done, elapsed)


def _figures(times: list[float], done: int, elapsed: float) -> dict[str, Any]:
    times.sort()
    return {"select1_us_p50": round(statistics.median(times), 1),
            "select1_us_p99": round(times[int(len(times) * 0.99) - 1], 1),
            "claims": done, "claim_tps": round(done / elapsed, 1)}


async def measure_async(name: str, p: dict[str, Any], rounds: int, claims: int) -> dict[str, Any]:
    if name == "aiomysql":
        import aiomysql

        conn = await aiomysql.connect(host=p["host"], port=p["port"], user=p["user"], password=p["password"],
                                      db=p["database"], autocommit=True)
    else:
        import asyncmy

        conn = await asyncmy.connect(host=p["host"], port=p["port"], user=p["user"], password=p["password"],
                                     database=p["database"], autocommit=True)
    cur = conn.cursor()
    if asyncio.iscoroutine(cur) or hasattr(cur, "__await__"):  # aiomysql: cursor() is awaited
        cur = await cur
    await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    for _ in range(200):
        await cur.execute("SELECT 1"); await cur.fetchall()
    times = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        await cur.execute("SELECT 1")
        await cur.fetchall()
        times.append((time.perf_counter_ns() - t) / 1000)
    t0 = time.perf_counter()
    done = 0
    for _ in range(claims):
        await cur.execute("BEGIN")
        await cur.execute(CLAIM)
        row = await cur.fetchone()
        if row is None:
            await cur.execute("COMMIT")
            break
        await cur.execute(DONE, (row[0],))
        await cur.execute("COMMIT")
        done += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    return _figures(times, done, elapsed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="mysql://user:password@host:port/database (else the private MariaDB)")
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=5000)
    args = parser.parse_args(argv)
    server = None
    dsn = args.dsn
    if dsn is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import mariadb_server  # the tests' private server

        server = mariadb_server.start()
        name = mariadb_server.fresh_database(server)
        dsn = server.dsn(name)
    p = _params(dsn)
    results: dict[str, Any] = {}
    try:
        setup = _sync_driver("pymysql")
        assert setup is not None, "PyMySQL is needed to set up the table"
        for name in ("pymysql", "mysqlclient", "mariadb", "aiomysql", "asyncmy"):
            with setup(p) as c, c.cursor() as cur:
                _fill(cur, args.claims)
                cur.execute("SELECT VERSION()")
                version = cur.fetchone()[0]
            try:
                if name in ("aiomysql", "asyncmy"):
                    __import__(name)
                    results[name] = asyncio.run(measure_async(name, p, args.rounds, args.claims))
                else:
                    connect = _sync_driver(name)
                    if connect is None:
                        results[name] = {"error": "not installed"}
                        continue
                    results[name] = measure_sync(lambda: connect(p), args.rounds, args.claims)
                from importlib.metadata import version as dist_version

                results[name]["version"] = dist_version({"pymysql": "PyMySQL"}.get(name, name))
            except ImportError:
                results[name] = {"error": "not installed"}
    finally:
        if server is not None:
            server.stop()
    print(json.dumps({"server": version, "python": platform.python_version(), "cpus": __import__("os").cpu_count(),
                      "rounds": args.rounds, "claims": args.claims, "drivers": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
