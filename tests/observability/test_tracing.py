"""OpenTelemetry traces (observability/tracing.py) with the SDK's in-memory exporter on real worker
runs: request -> enqueue -> execute -> downstream call is one trace, the execute span a child of the
enqueue span, for both lease modes and for enqueue_many; nothing stored when tracing is off."""

from __future__ import annotations

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode


@pytest.fixture
def traced(app):
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.enable_tracing(provider)
    yield provider.get_tracer("the-web-app"), exporter
    provider.shutdown()


def by_name(exporter):
    spans = {}
    for span in exporter.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    return spans


def traces_left(db):
    return db.execute("SELECT count(*) FROM skiplock.job_traces").fetchone()[0]


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_one_trace_from_the_request_to_the_handlers_downstream_call(app, db, traced, lease):
    tracer, exporter = traced

    @app.task(name="send", queue="mail", lease=lease)
    def send(job, to):
        job.conn.execute("SELECT 1")
        with tracer.start_as_current_span("downstream call"):
            pass

    with tracer.start_as_current_span("POST /signup"):
        job_id = app.enqueue("send", {"to": "a@example.com"})
    assert traces_left(db) == 1
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    assert app.get_job(job_id).state == "done"
    spans = by_name(exporter)
    request, = spans["POST /signup"]
    enqueue, = spans["skiplock enqueue send"]
    execute, = spans["skiplock execute send"]
    downstream, = spans["downstream call"]
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (enqueue, execute, downstream)} == {trace_id}
    assert enqueue.parent.span_id == request.context.span_id
    assert execute.parent.span_id == enqueue.context.span_id  # the job carried the context
    assert downstream.parent.span_id == execute.context.span_id
    assert execute.attributes["skiplock.job_id"] == job_id and execute.attributes["skiplock.outcome"] == "done"
    assert execute.attributes["messaging.destination.name"] == "mail"
    assert "to" not in str(dict(execute.attributes)) and "example.com" not in str(dict(enqueue.attributes))
    assert spans["skiplock claim"]
    assert traces_left(db) == 0  # forgotten once the job is done


def test_enqueue_many_jobs_continue_the_batch_span_and_a_failure_is_an_error(app, traced):
    tracer, exporter = traced

    @app.task(name="fast", max_attempts=1)
    def fast(job, n):
        if n == 3:
            raise ValueError("three")

    with tracer.start_as_current_span("import"):
        ids = app.enqueue_many([("fast", {"n": n}) for n in range(5)])
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    spans = by_name(exporter)
    enqueue, = spans["skiplock enqueue fast"]
    executes = spans["skiplock execute fast"]
    assert sorted(s.attributes["skiplock.job_id"] for s in executes) == ids
    assert {s.parent.span_id for s in executes} == {enqueue.context.span_id}
    failed = [s for s in executes if s.status.status_code == StatusCode.ERROR]
    assert [s.attributes["skiplock.outcome"] for s in failed] == ["failed"] and "three" in failed[0].status.description


def test_async_enqueue_on_an_async_connection_continues_the_trace(app, db, traced):
    """AsyncApp.enqueue / enqueue_many on the caller's AsyncConnection: the enqueue span, a child of
    the caller's, and the context kept in the caller's transaction (so nothing if it rolls back)."""
    import asyncio

    import psycopg

    from skiplock.aio import AsyncApp

    tracer, exporter = traced

    @app.task(name="send")
    def send(job):
        pass

    aapp = AsyncApp(app=app)

    async def produce() -> list[int]:
        async with await psycopg.AsyncConnection.connect(app.dsn) as aconn:
            with tracer.start_as_current_span("POST /async"):
                async with aconn.transaction():
                    one = await aapp.enqueue("send", {}, conn=aconn)
                    many = await aapp.enqueue_many([("send", {}), ("send", {})], conn=aconn)
                try:
                    async with aconn.transaction():
                        await aapp.enqueue("send", {}, conn=aconn)
                        raise RuntimeError("roll back")
                except RuntimeError:
                    pass
        return [one, *many]

    ids = asyncio.run(produce())
    assert traces_left(db) == 3  # the rolled-back enqueue left no carrier
    app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
    spans = by_name(exporter)
    request, = spans["POST /async"]
    enqueues = spans["skiplock enqueue send"]
    assert len(enqueues) == 3 and {e.parent.span_id for e in enqueues} == {request.context.span_id}
    executes = {s.attributes["skiplock.job_id"]: s for s in spans["skiplock execute send"]}
    assert set(ids) <= set(executes)
    assert {executes[i].context.trace_id for i in ids} == {request.context.trace_id}
    assert {executes[i].parent.span_id for i in ids} <= {e.context.span_id for e in enqueues}


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_a_retry_continues_the_trace_of_its_enqueue(app, db, traced, lease):
    """Every attempt's execute span is a child of the enqueue span -- also an attempt after one whose
    outcome (a retry) committed -- and the stored context goes with the job's final outcome."""
    tracer, exporter = traced
    from support import wait_for

    @app.task(name="flaky", lease=lease, max_attempts=3, retry=0.01)
    def flaky(job):
        if job.attempt < 3:
            raise ValueError(f"attempt {job.attempt}")

    with tracer.start_as_current_span("POST /flaky"):
        job_id = app.enqueue("flaky", {})
    def finished() -> bool:  # each run takes what is due; a retry is due 10 ms after its failure
        app.worker(concurrency=1, handle_signals=False).run(stop_when_empty=True)
        return app.get_job(job_id).state == "done"

    wait_for(finished, 30, "the third attempt to succeed", interval=0.02)
    spans = by_name(exporter)
    enqueue, = spans["skiplock enqueue flaky"]
    executes = sorted(spans["skiplock execute flaky"], key=lambda s: s.attributes["skiplock.attempt"])
    assert [s.attributes["skiplock.outcome"] for s in executes] == ["retry", "retry", "done"]
    assert {s.parent.span_id for s in executes} == {enqueue.context.span_id}
    assert traces_left(db) == 0


def test_a_batch_side_by_side_keeps_each_jobs_trace(app, db, dsn, traced):
    """Eight jobs of one claim, each enqueued under a request of its own (one with no stored
    context), run side by side on eight slots in one transaction: each execute span continues its
    own enqueuer's trace (the one without a context starts a trace of its own)."""
    import threading
    import time

    from skiplock.worker.batching import WholeBatches
    from support import wait_for

    tracer, exporter = traced
    starts: dict[int, tuple[str, str]] = {}

    @app.task(name="work")
    def work(job):
        time.sleep(0.4)  # first: while the handlers start, nobody uses the connection (a read of a
        # context by a handler could happen then, and would show in `takes`)
        xact = job.conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]  # the top transaction's
        starts[job.id] = (xact, threading.current_thread().name)

    store = app.tracing.store
    takes: list[list[int]] = []  # what each read of stored contexts asked for (on the lease's connection)
    real_take = store.take

    def take(lease, ids):
        takes.append(sorted(ids))
        return real_take(lease, ids)

    store.take = take
    worker = app.worker(concurrency=8, handle_signals=False, maintenance=False, poll_interval=5.0,
                        batch_policy=WholeBatches(8, batch_budget=30, side_by_side=True))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.started.is_set() and worker._sleeping == 8, what="every slot idle")
        requests: dict[int, int] = {}  # job id -> its request's span id
        with psycopg.connect(dsn) as conn:  # one commit: the eight arrive together
            for n in range(7):
                with tracer.start_as_current_span(f"POST /work/{n}") as request:
                    requests[app.enqueue("work", conn=conn)] = request.get_span_context().span_id
            untraced = app.enqueue("work", conn=conn)  # its context dropped: a job the claim finds none for
            conn.execute("DELETE FROM skiplock.job_traces WHERE job_id = %s", [untraced])
        ids = [*requests, untraced]
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'",
                                    [ids]).fetchone()[0] == 8, what="every job done")
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert len({xact for xact, _ in starts.values()}) == 1  # one claim's transaction
    # read once for the whole batch, before any job started (never by a handler's thread meanwhile)
    assert takes == [sorted(ids)]
    assert len({thread for _, thread in starts.values()}) == 8  # side by side
    spans = by_name(exporter)
    enqueues = {s.parent.span_id: s for s in spans["skiplock enqueue work"] if s.parent is not None}
    executes = {s.attributes["skiplock.job_id"]: s for s in spans["skiplock execute work"]}
    assert set(executes) == set(ids)
    for job_id, request in requests.items():
        enqueue = enqueues[request]
        assert executes[job_id].parent.span_id == enqueue.context.span_id
        assert executes[job_id].context.trace_id == enqueue.context.trace_id
    assert executes[untraced].parent is None
    assert max(s.start_time for s in executes.values()) < min(s.end_time for s in executes.values())
    assert traces_left(db) == 0


def test_nothing_is_stored_when_tracing_is_off(app, db):
    app.enqueue("anything")
    app.enqueue_many([("anything", {}) for _ in range(3)])
    assert traces_left(db) == 0


def test_the_documented_example_runs_and_shows_one_trace(dsn, tmp_path):
    """docs/observability.md's OpenTelemetry example, as written, in a process of its own (it sets the
    global tracer provider), against the test database (SKIPLOCK_DSN)."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    section = doc.split("## OpenTelemetry traces", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code += "\ntrace.get_tracer_provider().shutdown()\n"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SKIPLOCK_")}
    env["SKIPLOCK_DSN"] = dsn
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    spans = [json.loads(chunk) for chunk in re.findall(r"^\{.*?^\}", result.stdout, re.S | re.M)]
    by = {s["name"]: s for s in spans}
    request, enqueue = by["POST /signup"], by["skiplock enqueue send_welcome_email"]
    execute, smtp = by["skiplock execute send_welcome_email"], by["smtp send"]
    assert len({s["context"]["trace_id"] for s in (request, enqueue, execute, smtp)}) == 1
    assert execute["parent_id"] == enqueue["context"]["span_id"] and smtp["parent_id"] == execute["context"]["span_id"]


def test_outbox_put_and_deliver_spans(app, traced):
    tracer, exporter = traced

    class Collect:
        def __init__(self):
            self.payloads = []

        def deliver(self, message):
            if message.payload["n"] == 2:
                raise RuntimeError("receiver down")
            self.payloads.append(message.payload)

    sink = Collect()
    with tracer.start_as_current_span("POST /order"):
        app.outbox.put("orders", {"n": 1})
        app.outbox.put("orders", {"n": 2}, max_attempts=1)
    app.relay(sink, listen=False).run(stop_when_empty=True)
    spans = by_name(exporter)
    request, = spans["POST /order"]
    puts = spans["skiplock outbox put orders"]
    assert len(puts) == 2 and {p.parent.span_id for p in puts} == {request.context.span_id}
    delivers = spans["skiplock outbox deliver orders"]
    assert sum(d.attributes["messaging.batch.message_count"] for d in delivers) == 2
    assert sum(d.attributes["skiplock.outbox.failed"] for d in delivers) == 1
    assert [d.status.status_code for d in delivers if d.attributes["skiplock.outbox.failed"]] == [StatusCode.ERROR]
    # each deliver span links to the put span of every message it delivered (stored with the message)
    linked = {(link.context.trace_id, link.context.span_id) for d in delivers for link in d.links}
    assert linked == {(p.context.trace_id, p.context.span_id) for p in puts}


def test_a_redriven_message_links_to_its_put_and_a_rolled_back_put_stores_nothing(app, dsn, db, traced):
    tracer, exporter = traced

    class Refuse:
        def deliver(self, message):
            raise RuntimeError("receiver down")

    with tracer.start_as_current_span("POST /refund"):
        ref = app.outbox.put("refunds", {"n": 1}, max_attempts=1)
    with psycopg.connect(dsn) as conn:
        with tracer.start_as_current_span("POST /cancelled"):
            app.outbox.put("refunds", {"n": 2}, conn=conn)
        conn.rollback()
    assert db.execute("SELECT message_id FROM skiplock.outbox_traces").fetchall() == [(ref.id,)]
    app.relay(Refuse(), listen=False).run(stop_when_empty=True)
    assert app.outbox.redrive([ref.id]) == [ref.id]
    app.relay(Refuse(), listen=False).run(stop_when_empty=True)
    spans = by_name(exporter)
    put, = spans["skiplock outbox put refunds"][:1]
    delivers = spans["skiplock outbox deliver refunds"]
    assert len(delivers) == 2  # the first delivery and the redriven one, both linked to the put
    assert all([link.context.span_id for link in d.links] == [put.context.span_id] for d in delivers)


def test_outbox_put_async_on_an_async_connection_makes_its_span_and_links_the_delivery(app, db, traced):
    """``outbox.put_async`` on the caller's AsyncConnection: the put span, a child of the caller's;
    the context stored in the caller's transaction (none if it rolls back); the deliver span links."""
    import asyncio

    tracer, exporter = traced

    async def produce() -> int:
        async with await psycopg.AsyncConnection.connect(app.dsn) as aconn:
            with tracer.start_as_current_span("POST /async-order"):
                async with aconn.transaction():
                    ref = await app.outbox.put_async("async-orders", {"n": 1}, conn=aconn)
                try:
                    async with aconn.transaction():
                        await app.outbox.put_async("async-orders", {"n": 2}, conn=aconn)
                        raise RuntimeError("roll back")
                except RuntimeError:
                    pass
        return ref.id

    kept = asyncio.run(produce())
    assert db.execute("SELECT message_id FROM skiplock.outbox_traces").fetchall() == [(kept,)]

    class Collect:
        def deliver(self, message):
            pass

    app.relay(Collect(), listen=False).run(stop_when_empty=True)
    spans = by_name(exporter)
    request, = spans["POST /async-order"]
    puts = spans["skiplock outbox put async-orders"]
    assert len(puts) == 2 and {p.parent.span_id for p in puts} == {request.context.span_id}
    deliver, = spans["skiplock outbox deliver async-orders"]
    assert [link.context.span_id for link in deliver.links] == [puts[0].context.span_id]
