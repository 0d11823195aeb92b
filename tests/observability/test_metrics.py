"""Prometheus metrics (observability/metrics.py): scraped from a real worker's endpoint after real
runs, counters moved as the jobs did; the token is required; labels stay bounded; registries per App."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import textwrap
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import skiplock
from skiplock.observability.metrics import MetricsServer, metrics_asgi_app

from support import cli_argv, cli_env, wait_for

TOKEN = "test-token-0123456789"


def parse(text):
    """{(sample name, frozenset(labels)): value}"""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def served(app):
    server = MetricsServer(app.enable_metrics(), "127.0.0.1", 0, TOKEN).start()
    yield f"http://127.0.0.1:{server.port}/metrics"
    server.stop()


def scrape(url, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, headers=headers, timeout=10)


def test_counters_move_with_a_real_worker_run(app, served):
    @app.task(name="ok", queue="mail")
    def ok(job):
        return 1

    @app.task(name="boom", queue="mail", max_attempts=2, retry=0)
    def boom(job):
        raise ValueError("no")

    before = parse(scrape(served).text)
    assert value(before, "skiplock_jobs_finished_total", task="ok", queue="mail", outcome="done") is None
    app.enqueue_many([("ok", {}) for _ in range(5)])
    app.enqueue("boom")
    app.enqueue("mystery", queue="mail")  # a task no worker here registers: folded into "other"
    stats = app.worker(queues=["mail"], concurrency=2, handle_signals=False).run(stop_when_empty=True)
    assert stats.done == 5 and stats.failed == 1
    after = parse(scrape(served).text)
    assert value(after, "skiplock_jobs_enqueued_total", task="ok", queue="mail") == 5
    assert value(after, "skiplock_jobs_enqueued_total", task="other", queue="mail") == 1
    assert value(after, "skiplock_jobs_started_total", task="ok", queue="mail") == 5
    assert value(after, "skiplock_jobs_started_total", task="boom", queue="mail") == 2
    assert value(after, "skiplock_jobs_finished_total", task="ok", queue="mail", outcome="done") == 5
    assert value(after, "skiplock_jobs_finished_total", task="boom", queue="mail", outcome="retry") == 1
    assert value(after, "skiplock_jobs_finished_total", task="boom", queue="mail", outcome="failed") == 1
    assert value(after, "skiplock_job_duration_seconds_count", task="ok", queue="mail") == 5
    assert value(after, "skiplock_job_queue_wait_seconds_count", task="ok", queue="mail") == 5
    assert value(after, "skiplock_jobs_in_flight") == 0
    # sampled by the worker's sampler (at its start here: the seven jobs were due)
    assert value(after, "skiplock_queue_ready_jobs", queue="mail") in (7, 6, 5, 4, 3, 2, 1)
    assert value(after, "skiplock_sample_timestamp_seconds") > 0
    # a worker sampling often: the unregistered job is still due in "mail"
    worker = app.worker(queues=["mail"], concurrency=1, handle_signals=False, metrics_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: value(parse(scrape(served).text), "skiplock_queue_ready_jobs", queue="mail") == 1, 30,
                 "the sampled depth of 'mail'")
    finally:
        worker.stop()
        thread.join(30)
    # no job ids or args in any label
    labels = {v for (_, ls) in after for _, v in ls}
    assert not any(re.fullmatch(r"\d+", v) for v in labels), labels


def test_the_endpoint_refuses_a_request_without_the_token(served):
    assert scrape(served, token=None).status_code == 401
    assert scrape(served, token="wrong").status_code == 401
    refused = scrape(served, token=None)
    assert "skiplock_" not in refused.text
    assert scrape(served).status_code == 200


def test_queue_gauges_are_sampled_on_an_interval_not_per_scrape(app):
    metrics = app.enable_metrics()
    app.enqueue("nobody_runs_this", queue="idle")
    app.enqueue("nobody_runs_this", queue="idle")
    metrics.sample()
    assert metrics.ready.labels("idle")._value.get() == 2
    app.enqueue("nobody_runs_this", queue="idle")
    assert value(parse(metrics.exposition().decode()), "skiplock_queue_ready_jobs", queue="idle") == 2  # not re-read
    metrics.sample()
    assert value(parse(metrics.exposition().decode()), "skiplock_queue_ready_jobs", queue="idle") == 3


def test_each_app_has_its_own_registry(dsn):
    a, b = skiplock.App(dsn), skiplock.App(dsn)
    try:
        ma, mb = a.enable_metrics(), b.enable_metrics()
        assert ma.registry is not mb.registry and a.enable_metrics() is ma
        a.enqueue("x")
        assert value(parse(ma.exposition().decode()), "skiplock_jobs_enqueued_total", task="other", queue="default") == 1
        assert value(parse(mb.exposition().decode()), "skiplock_jobs_enqueued_total", task="other",
                     queue="default") is None
    finally:
        a.close()
        b.close()


def call_asgi(asgi, headers=()):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(asgi({"type": "http", "method": "GET", "path": "/metrics", "headers": list(headers)}, receive, send))
    return sent[0]["status"], sent[1]["body"]


def test_the_asgi_app_needs_its_token_unless_mounted_behind_auth(app):
    status, body = call_asgi(metrics_asgi_app(app, token=TOKEN))
    assert status == 401 and b"skiplock_" not in body
    status, body = call_asgi(metrics_asgi_app(app, token=TOKEN), [(b"authorization", f"Bearer {TOKEN}".encode())])
    assert status == 200 and b"skiplock_jobs_in_flight" in body
    status, body = call_asgi(metrics_asgi_app(app, token=None))  # the dashboard authenticates itself
    assert status == 200
    with pytest.raises(TypeError):
        metrics_asgi_app(app)  # the token (or None) must be given explicitly


def test_skiplock_worker_metrics_port_serves_with_a_generated_token(dsn, tmp_path):
    (tmp_path / "metricsapp.py").write_text(textwrap.dedent("""
        import skiplock
        app = skiplock.App()

        @app.task(name="hello")
        def hello(job):
            return "hi"
    """))
    env = cli_env(tmp_path, XDG_RUNTIME_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(cli_argv(dsn, "worker", "--app", "metricsapp:app", "--concurrency", "1",
                                     "--metrics-port", "0"), cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "metrics at" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the worker exited before serving metrics"
        url = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line).group(1)
        token_file = re.search(r"token is in (\S+) ", line).group(1)
        assert oct(os.stat(token_file).st_mode & 0o777) == "0o600"
        token = open(token_file).read().strip()
        assert token not in line
        assert scrape(url, token=None).status_code == 401
        skiplock.App(dsn).enqueue("hello")
        wait_for(lambda: value(parse(scrape(url, token).text), "skiplock_jobs_finished_total", task="hello",
                               queue="default", outcome="done") == 1, 30, "the job counted done")
        samples = parse(scrape(url, token).text)
        assert value(samples, "skiplock_worker_slots") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_outbox_backlog_and_delivery_outcomes(app, served):
    class Collect:
        def deliver(self, message):
            if message.payload["n"] == 2:
                raise RuntimeError("receiver down")

    for n in range(3):
        app.outbox.put("orders", {"n": n}, max_attempts=1)
    app.metrics.sample()
    assert value(parse(scrape(served).text), "skiplock_outbox_backlog") == 3
    app.relay(Collect(), listen=False).run(stop_when_empty=True)  # its counts stay after it stopped
    samples = parse(scrape(served).text)
    assert value(samples, "skiplock_outbox_deliveries_total", outcome="sent") == 2
    assert value(samples, "skiplock_outbox_deliveries_total", outcome="failed") == 1
