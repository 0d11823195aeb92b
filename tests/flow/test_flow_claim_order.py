"""Which claim a slot tries first when flow-controlled jobs may be waiting (worker/claiming.py): a
plain claim that found nothing is not tried first again for ``PLAIN_REST_SECONDS`` while the
process's flow claims find work -- counted with the plain claim's own trace spans (OpenTelemetry's in-memory
exporter) -- and plain jobs enqueued while every slot drains a flow backlog still start before the
backlog is done (the rest delays them; it does not starve them)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import wait_for

import skiplock
from skiplock.worker import claiming
from skiplock.worker.batching import WholeBatches
from skiplock.worker.claiming import PLAIN_REST_SECONDS

BUDGET = 0.05  # batch_budget of late_arrivals' worker: 20 ms jobs are over a quarter of it (slow)


def make_app(dsn: str, seconds: float = 0.0) -> skiplock.App:
    app = skiplock.App(dsn)

    def record(job: Any, part: str) -> None:
        job.conn.execute("INSERT INTO flow_runs (job_id, part, started, ended, pid) "
                         "VALUES (%s, %s, clock_timestamp(), clock_timestamp(), pg_backend_pid())", (job.id, part))
        time.sleep(seconds)

    @app.task("fair_job", queue="fair")
    def fair_job(job, part):
        record(job, part)

    @app.task("plain_job", queue="fair_plain")
    def plain_job(job, part):
        record(job, part)

    app.set_queue_limits("fair", fair=True)
    return app


def run(app: skiplock.App, worker: Any, condition: Any) -> float:
    thread = threading.Thread(target=worker.run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        wait_for(condition, timeout=60, what="the runs")
        return time.monotonic() - started
    finally:
        worker.stop()
        thread.join(30)


def drain_traced(app: skiplock.App, runs: psycopg.Connection[Any], jobs: list[Any], size: int,
                 slots: int = 1) -> tuple[float, Any]:
    """Enqueue ``jobs``, run ``slots`` slots taking whole batches of ``size`` until all ran, with
    tracing on: (seconds it took, every finished span)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.enable_tracing(provider)
    app.enqueue_many(jobs)
    worker = app.worker(concurrency=slots, poll_interval=0.5, handle_signals=False, adaptive_limit=False,
                        batch_policy=WholeBatches(batch_size=size))
    elapsed = run(app, worker, lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == len(jobs))
    return elapsed, exporter.get_finished_spans()


def test_an_empty_plain_claim_is_not_tried_first_before_every_other_flow_claim(dsn: str,
                                                                                runs: psycopg.Connection[Any]):
    jobs, size = 400, 4
    app = make_app(dsn)
    elapsed, spans = drain_traced(app, runs, [("fair_job", {"part": f"p{i % 20}"}, {"partition": f"p{i % 20}"})
                                              for i in range(jobs)], size)
    plain = [s for s in spans if s.name == "skiplock claim"]
    assert all(s.attributes["skiplock.claimed"] == 0 for s in plain)
    # 100 flow claims: alternating, every other one came after an empty plain claim (50); now one
    # per PLAIN_REST_SECONDS at most, plus those of the idle slot at the start and end
    assert len(plain) <= 4 + elapsed / PLAIN_REST_SECONDS, (len(plain), elapsed)
    assert len(plain) < jobs / size / 2, (len(plain), elapsed)
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == jobs
    app.close()


def late_arrivals(app: skiplock.App, runs: psycopg.Connection[Any], backlog: list[Any], late: list[Any]) -> list[str]:
    """Two slots drain ``backlog``; once 50 of its jobs ran, ``late`` is enqueued. Returns every run's
    part, in the order they started."""
    app.enqueue_many(backlog)
    worker = app.worker(concurrency=2, poll_interval=0.05, handle_signals=False, adaptive_limit=False,
                        batch_budget=BUDGET)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] >= 50, timeout=60,
                 what="the backlog's drain under way")
        app.enqueue_many(late)
        wait_for(lambda: runs.execute("SELECT count(*) FROM flow_runs").fetchone()[0] == len(backlog) + len(late),
                 timeout=60, what="every job")
    finally:
        worker.stop()
        thread.join(30)
    return [part for (part,) in runs.execute("SELECT part FROM flow_runs ORDER BY started, job_id")]


def test_plain_jobs_are_not_starved_by_a_flow_backlog(dsn: str, runs: psycopg.Connection[Any]):
    app = make_app(dsn, seconds=0.02)  # measured slow (over BUDGET / 4): one job per claim
    order = late_arrivals(app, runs, [("fair_job", {"part": f"p{i % 10}"}, {"partition": f"p{i % 10}"})
                                      for i in range(500)], [("plain_job", {"part": "plain"}, {}) for _ in range(5)])
    last_plain = max(i for i, part in enumerate(order) if part == "plain")
    assert last_plain < len(order) - 50, (last_plain, len(order))  # well before the backlog was done
    app.close()


def test_an_empty_flow_claim_backs_off_while_plain_claims_find_work(dsn: str, runs: psycopg.Connection[Any]):
    """The mirror rule: a worker whose app has flow-controlled work (a fair queue here, with no job
    in it) drains a plain backlog; a flow claim that finds nothing is tried first again only after a
    rest that doubles with each empty one (50 ms up to ``PLAIN_REST_SECONDS``) -- counted with the
    flow claim's own spans. A fixed 50 ms rest made every other claim an empty flow claim."""
    jobs, size = 1500, 4
    app = make_app(dsn)
    elapsed, spans = drain_traced(app, runs, [("plain_job", {"part": "plain"}, {}) for _ in range(jobs)], size)
    flow = [s for s in spans if s.name == "skiplock flow claim"]
    plain = [s for s in spans if s.name == "skiplock claim"]
    assert all(s.attributes["skiplock.claimed"] == 0 for s in flow)
    assert len(plain) >= jobs / size
    # rests of 0.05, 0.1, 0.2, 0.4, 0.8 s, then PLAIN_REST_SECONDS each; plus the idle slot's at the end
    assert len(flow) <= 8 + elapsed / PLAIN_REST_SECONDS, (len(flow), elapsed, len(plain))
    assert len(flow) < len(plain) / 4, (len(flow), len(plain))  # a fixed 50 ms: every other claim
    app.close()


def test_the_rests_are_the_processs_not_each_slots(dsn: str, runs: psycopg.Connection[Any]):
    """An empty flow claim walks the plain jobs waiting ahead on the claim index (and an empty plain
    claim the flow ones): with a rest per slot a process made about one a second per slot, so with
    more slots more of them. With 8 slots the empty flow claims of a plain drain are still about one
    per rest of the process (bursts: slots whose claims were under way when a rest began)."""
    jobs, size, slots = 3000, 4, 8
    app = make_app(dsn)
    elapsed, spans = drain_traced(app, runs, [("plain_job", {"part": "plain"}, {}) for _ in range(jobs)], size,
                                  slots=slots)
    flow = [s for s in spans if s.name == "skiplock flow claim"]
    assert all(s.attributes["skiplock.claimed"] == 0 for s in flow)
    # rests of 0.05, 0.1, 0.2, then PLAIN_REST_SECONDS each, twice that for the bursts, plus one
    # per slot at the start and the end; per slot it was about slots x (3 + elapsed / the rest)
    assert len(flow) <= 2 * slots + 2 * elapsed / PLAIN_REST_SECONDS, (len(flow), elapsed)
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == jobs
    app.close()


def test_a_flow_job_is_not_starved_by_a_plain_backlog(dsn: str, runs: psycopg.Connection[Any]):
    """...and the rest delays a flow job enqueued under a plain backlog, it does not starve it."""
    app = make_app(dsn, seconds=0.01)
    order = late_arrivals(app, runs, [("plain_job", {"part": "plain"}, {}) for _ in range(600)],
                          [("fair_job", {"part": "fair"}, {"partition": "p1"})])
    assert order.index("fair") < len(order) - 150, (order.index("fair"), len(order))  # well before the end
    app.close()


@pytest.mark.parametrize("kind", ["flow", "plain"])
def test_a_rest_lasts_at_least_the_last_empty_walk_over_its_share(dsn: str, runs: psycopg.Connection[Any],
                                                                    monkeypatch: pytest.MonkeyPatch, kind: str):
    """An empty claim of one kind walks the other kind's waiting jobs (a cost that grows with them),
    so the rest after it is at least its duration / ``WALK_SHARE``. With a share so small that any
    claim's duration makes the rest outlast the drain, the empty claims of the other kind are only
    the first look of each slot (before any rest) -- with the share's default, about 4 a second."""
    monkeypatch.setattr(claiming, "WALK_SHARE", 1e-6)  # a 0.1 ms claim: a rest of 100 s
    jobs, size, slots = 1200, 4, 4
    app = make_app(dsn)
    if kind == "flow":  # a plain drain: the empty claims are flow claims
        backlog = [("plain_job", {"part": "plain"}, {}) for _ in range(jobs)]
    else:  # a fair drain: the empty claims are plain ones
        backlog = [("fair_job", {"part": f"p{i % 20}"}, {"partition": f"p{i % 20}"}) for i in range(jobs)]
    elapsed, spans = drain_traced(app, runs, backlog, size, slots=slots)
    name = "skiplock flow claim" if kind == "flow" else "skiplock claim"
    empty = [s for s in spans if s.name == name]
    assert all(s.attributes["skiplock.claimed"] == 0 for s in empty)
    # an empty claim of the other kind (every job held by other slots) tries this kind at once, rest
    # or not; besides those: each slot's first look, those under way when the first rest began, and
    # the idle slots' at the end
    other = "skiplock claim" if kind == "flow" else "skiplock flow claim"
    at_once = [s for s in spans if s.name == other and s.attributes["skiplock.claimed"] == 0]
    assert len(empty) <= 2 * slots + len(at_once), (len(empty), len(at_once), elapsed)
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == jobs
    app.close()
