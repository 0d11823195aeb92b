"""``python -m bench --only aio``: the asyncio worker at 1,000 concurrent I/O-bound jobs on at most 20
connections, beside pgqueuer (see bench/aio_worker.py for the method)."""

from __future__ import annotations

from .aio_worker import GOAL, JOBS, MAX_CONNECTIONS, run_all
from .common import Context, Figure, fresh_db


def run(ctx: Context) -> list[Figure]:
    jobs = JOBS if ctx.sizes.drain_jobs >= 10_000 else 1_000  # --quick: a smoke run
    ctx.log(f"aio: {jobs:,} claimed-lease jobs of await asyncio.sleep(1), 1 process, concurrency 1,000, "
            f"at most {MAX_CONNECTIONS} connections; then pgqueuer (1 connection) if installed")
    out = run_all(lambda label, migrate=True: fresh_db(ctx.server, label, migrate), jobs)
    ctx.raw["aio"] = out
    s = "aio"
    sk = out["skiplock"]
    figures = [
        Figure(s, f"asyncio worker, {jobs:,} × sleep(1) jobs, concurrency 1,000", sk["throughput"], "jobs/s",
               baseline_or_target=GOAL, reference=f"goal {GOAL:,.0f} jobs/s", goal=">= 1", details=sk),
        Figure(s, "asyncio worker: most database sessions at once", sk["max_sessions"], "sessions",
               baseline_or_target=MAX_CONNECTIONS, reference=f"at most {MAX_CONNECTIONS}", goal="<= 1", details=sk),
    ]
    pq = out.get("pgqueuer")
    if pq is not None and "error" not in pq:
        figures.append(Figure(s, f"pgqueuer (1 connection), {jobs:,} × sleep(1) jobs, concurrency 1,000",
                              pq["throughput"], "jobs/s", baseline_or_target=sk["throughput"],
                              reference="skiplock's asyncio worker", details=pq))
    return figures
