"""The asyncio worker at I/O-bound concurrency (issue 15, section 6), beside pgqueuer.

5,000 queued jobs that each ``await asyncio.sleep(1)`` (no database work), drained by ONE process:

- skiplock: ``AsyncApp.run_async_worker(concurrency=1000, max_connections=20)``, claimed lease (an
  in-flight job holds no connection; heartbeats renewed in batches);
- pgqueuer (if installed: ``pip install pgqueuer``): ``QueueManager`` on one psycopg
  ``AsyncConnection`` (its documented set-up), ``max_concurrent_tasks=1000``, ``batch_size=500`` (its largest for that cap),
  ``mode=drain``.

Each runs in a child process of its own (``python -m bench.aio_worker child <queue> <dsn>``) on a
fresh database, the jobs enqueued before the child starts. Throughput = jobs / the child's wall time
from the start of its worker to its return (both drain until the queue is empty, so the figure
includes the last second of sleeping: 5,000 jobs at 1,000 at once cannot take less than 5 s,
1,000 jobs/s). The parent samples ``pg_stat_activity`` every 20 ms for the child's sessions on that
database and reports the most seen at once. Run alone:

    python -m bench.aio_worker --dsn postgresql://…   # prints the JSON
    python -m bench --only aio                         # as a scenario of the benchmark run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

JOBS = 5_000
CONCURRENCY = 1_000
MAX_CONNECTIONS = 20
GOAL = 800.0  # jobs/s


async def _skiplock(dsn: str, jobs: int) -> dict[str, Any]:
    import skiplock

    aapp = skiplock.AsyncApp(dsn)

    @aapp.task(name="sleep1", lease="claimed")
    async def sleep1(job):
        await asyncio.sleep(1)

    await aapp.migrate()
    await aapp.enqueue_many([("sleep1", {}) for _ in range(jobs)])
    print("ready", flush=True)
    sys.stdin.readline()  # the parent's sampler is running
    began = time.perf_counter()
    stats = await aapp.run_async_worker(concurrency=CONCURRENCY, max_connections=MAX_CONNECTIONS,
                                        stop_when_empty=True)
    seconds = time.perf_counter() - began
    done = (await aapp.counts())
    await aapp.close()
    return {"seconds": seconds, "done": stats.done, "lost": stats.lost, "failed": stats.failed,
            "counts": [list(c) for c in done]}


async def _pgqueuer(dsn: str, jobs: int) -> dict[str, Any]:
    from pgqueuer import PsycopgDriver, QueueManager, Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    driver = PsycopgDriver(conn)
    queries = Queries(driver)
    await queries.install()
    await queries.enqueue(["sleep1"] * jobs, [None] * jobs, [0] * jobs)
    done = 0
    qm = QueueManager(queries)

    @qm.entrypoint("sleep1")
    async def sleep1(job: Any) -> None:
        nonlocal done
        await asyncio.sleep(1)
        done += 1

    print("ready", flush=True)
    sys.stdin.readline()
    began = time.perf_counter()
    await qm.run(batch_size=CONCURRENCY // 2, max_concurrent_tasks=CONCURRENCY, mode=QueueExecutionMode.drain)
    seconds = time.perf_counter() - began
    left = (await (await conn.execute("SELECT count(*) FROM pgqueuer")).fetchone())[0]  # type: ignore[index]
    await conn.close()
    return {"seconds": seconds, "done": done, "left_in_queue": left}


def measure(dsn: str, queue: str, jobs: int = JOBS) -> dict[str, Any]:
    """Run one queue's child on ``dsn`` (a fresh database) and sample its sessions."""
    child = subprocess.Popen([sys.executable, "-m", "bench.aio_worker", "child", queue, dsn, str(jobs)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"{queue}: the child did not start")
    peak = 0
    stop = threading.Event()
    with psycopg.connect(dsn, autocommit=True) as mon:
        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                row = mon.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchone()
                n = row[0] if row else 0
                peak = max(peak, n)
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        out = child.stdout.read()
        child.wait()
        stop.set()
        sampler.join()
    result = json.loads(out.strip().splitlines()[-1])
    result.update(queue=queue, jobs=jobs, throughput=jobs / result["seconds"], max_sessions=peak,
                  concurrency=CONCURRENCY)
    return result


def run_all(new_db: Any, jobs: int = JOBS) -> dict[str, Any]:
    """skiplock, then pgqueuer if it is installed; ``new_db(label)`` is a context manager giving a DSN."""
    out: dict[str, Any] = {}
    with new_db("aio_skiplock") as dsn:
        out["skiplock"] = measure(dsn, "skiplock", jobs)
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        out["pgqueuer"] = None
    else:
        try:
            with new_db("aio_pgqueuer", migrate=False) as dsn:
                out["pgqueuer"] = measure(dsn, "pgqueuer", jobs)
        except Exception as exc:  # noqa: BLE001 - reported, and skiplock's figures are kept
            out["pgqueuer"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "child":
        queue, dsn, jobs = args[1], args[2], int(args[3])
        result = asyncio.run(_skiplock(dsn, jobs) if queue == "skiplock" else _pgqueuer(dsn, jobs))
        print(json.dumps(result), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.aio_worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True, help="an existing server (a database per queue is created on it)")
    p.add_argument("--jobs", type=int, default=JOBS)
    a = p.parse_args(args)
    from .common import from_dsn, fresh_db

    server = from_dsn(a.dsn)
    print(json.dumps(run_all(lambda label, migrate=True: fresh_db(server, label, migrate), a.jobs), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
