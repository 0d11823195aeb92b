"""Prometheus metrics of one App (``pip install 'skiplock[metrics]'``): ``app.enable_metrics()``.

Every metric lives in the App's own ``CollectorRegistry`` (never prometheus_client's global one), so
several Apps in a process, and tests, never collide. Served by ``skiplock worker --metrics-port N``
(:func:`serve_metrics`, a bearer token required) or mounted in an ASGI app (:func:`metrics_asgi_app`,
what the dashboard serves at ``/metrics``).

Label sets are bounded: no job ids, no arguments; ``task`` is a task this App registers or ``other``;
``queue`` one of the first ``MAX_QUEUES`` queue names seen or ``other``; ``outcome`` one of a fixed few.

What is measured where:

- per job, in the process that enqueued or ran it: ``skiplock_jobs_enqueued_total{task,queue}``,
  ``skiplock_jobs_started_total{task,queue}``, ``skiplock_jobs_finished_total{task,queue,outcome}``
  (done, retry, failed, cancelled, snoozed, lease_lost; counted once durable),
  ``skiplock_job_duration_seconds{task,queue}`` (handler time), ``skiplock_job_queue_wait_seconds{task,queue}``
  (from due to claimed, the database's clock), ``skiplock_jobs_in_flight`` (handlers running now);
- read at scrape time from the worker's and relay's own counters (no per-job cost):
  ``skiplock_worker_slots``, ``skiplock_worker_slots_busy``, ``skiplock_worker_lease_limit`` and
  ``skiplock_worker_leases_held`` (the lease governor's limit and permits held: worker/governor.py),
  ``skiplock_worker_lease_limit_changes_total``, ``skiplock_reconnects_total``,
  ``skiplock_lease_losses_total``, ``skiplock_rescues_total``, ``skiplock_outbox_deliveries_total{outcome}``;
- sampled by one cheap query every ``interval`` seconds (:class:`Sampler`, run by the worker; never per
  scrape): ``skiplock_queue_ready_jobs{queue}``, ``skiplock_queue_oldest_ready_age_seconds{queue}``
  (jobs due now, per queue: the read model's ``oldest_ready``), ``skiplock_outbox_backlog`` (pending
  messages), ``skiplock_sample_timestamp_seconds``.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("skiplock's metrics need prometheus_client: pip install 'skiplock[metrics]'") from exc

from ..maintenance.service import Service

if TYPE_CHECKING:
    from ..backend.base import ClaimedJob

log = logging.getLogger("skiplock.metrics")

MAX_QUEUES = 50
OTHER = "other"
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)
TOKEN_ENV = ("SKIPLOCK_METRICS_TOKEN", "SKIPLOCK_DASHBOARD_TOKEN")


class Metrics:
    """An App's metrics (see the module's docstring); ``registry`` is what to expose."""

    def __init__(self, app: Any, registry: CollectorRegistry | None = None):
        self.app = app
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        labels = ("task", "queue")
        self.enqueued_total = Counter("skiplock_jobs_enqueued", "Jobs enqueued by this process.", labels, registry=r)
        self.started_total = Counter("skiplock_jobs_started", "Job attempts started (handler called).", labels,
                                     registry=r)
        self.finished_total = Counter("skiplock_jobs_finished", "Job attempts finished, once durable, by outcome.",
                                      (*labels, "outcome"), registry=r)
        self.duration = Histogram("skiplock_job_duration_seconds", "Handler run time.", labels,
                                  buckets=DURATION_BUCKETS, registry=r)
        self.queue_wait = Histogram("skiplock_job_queue_wait_seconds", "From due (run_at) to claimed.", labels,
                                    buckets=WAIT_BUCKETS, registry=r)
        self.running: set[int] = set()  # ids of the jobs whose handler runs now (set.add/discard: no lock)
        self.in_flight = Gauge("skiplock_jobs_in_flight", "Handlers running now in this process.", registry=r)
        self.in_flight.set_function(lambda: len(self.running))
        self.ready = Gauge("skiplock_queue_ready_jobs", "Jobs due now, per queue (sampled).", ("queue",), registry=r)
        self.oldest = Gauge("skiplock_queue_oldest_ready_age_seconds", "Age of the oldest job due now (sampled).",
                            ("queue",), registry=r)
        self.outbox_backlog = Gauge("skiplock_outbox_backlog", "Outbox messages pending delivery (sampled).",
                                    registry=r)
        self.sampled_at = Gauge("skiplock_sample_timestamp_seconds", "When the sampled gauges were last read.",
                                registry=r)
        self.workers: list[Any] = []
        self.relays: list[Any] = []
        self._queues: set[str] = set()
        self._children: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}
        self._finished: dict[tuple[str, str, str], Any] = {}
        self._retired: dict[str, int] = {}  # the counts of runners that stopped
        self._lock = threading.Lock()
        r.register(_RunnerCollector(self))

    # ---- labels ----------------------------------------------------------------------------

    def labels(self, task: str, queue: str) -> tuple[str, str]:
        """The bounded (task, queue) labels of a job."""
        if task not in self.app.tasks:
            task = OTHER
        if queue not in self._queues:
            with self._lock:
                if len(self._queues) < MAX_QUEUES:
                    self._queues.add(queue)
                else:
                    queue = OTHER
        return task, queue

    def _series(self, task: str, queue: str) -> tuple[Any, Any, Any, Any]:
        key = (task, queue)
        series = self._children.get(key)
        if series is None:
            t, q = self.labels(task, queue)
            series = (self.enqueued_total.labels(t, q), self.started_total.labels(t, q),
                      self.duration.labels(t, q), self.queue_wait.labels(t, q))
            if len(self._children) < 10_000:
                self._children[key] = series
        return series

    # ---- what the App and the worker report ------------------------------------------------------

    def enqueued(self, jobs: Sequence[Any]) -> None:
        counts: dict[tuple[str, str], int] = {}
        for job in jobs:
            key = (job.task, job.queue)
            counts[key] = counts.get(key, 0) + 1
        for (task, queue), n in counts.items():
            self._series(task, queue)[0].inc(n)

    def job_started(self, claimed: "ClaimedJob") -> None:
        series = self._series(claimed.task, claimed.queue)
        series[1].inc()
        series[3].observe(max(0.0, (claimed.claimed_at - claimed.run_at).total_seconds()))
        self.running.add(claimed.id)

    def job_ended(self, claimed: "ClaimedJob") -> None:
        self.running.discard(claimed.id)

    def jobs_finished(self, finished: "dict[tuple[str, str, str], int]") -> None:
        """One claim's finished jobs, counted by (task, queue, outcome): one increment per key."""
        for key, n in finished.items():
            child = self._finished.get(key)
            if child is None:
                task, queue = self.labels(key[0], key[1])
                child = self.finished_total.labels(task, queue, key[2])
                if len(self._finished) < 10_000:
                    self._finished[key] = child
            child.inc(n)

    def job_duration(self, claimed: "ClaimedJob", seconds: float) -> None:
        self._series(claimed.task, claimed.queue)[2].observe(seconds)

    def attach(self, runner: Any) -> None:
        """Read a worker's (``Worker``) or relay's (``Relay``) counters at scrape time."""
        with self._lock:
            runners = self.relays if hasattr(runner, "sink") else self.workers
            if runner not in runners:
                runners.append(runner)

    def detach(self, runner: Any) -> None:
        """A stopped runner: its counts are kept (counters never go down), its gauges go."""
        with self._lock:
            for runners in (self.workers, self.relays):
                if runner in runners:
                    runners.remove(runner)
                    for name, n in _counts([runner] if runners is self.workers else [],
                                           [runner] if runners is self.relays else []).items():
                        self._retired[name] = self._retired.get(name, 0) + n

    def sample(self) -> None:
        """Read the sampled gauges now: one statement for the queues, one for the outbox."""
        rows = self.app.read_model.oldest_ready()
        seen = set()
        for row in rows:
            _, queue = self.labels("", row.queue)
            seen.add(queue)
            self.ready.labels(queue).set(row.ready)
            self.oldest.labels(queue).set(row.age.total_seconds())
        for queue in self._queues - seen:  # nothing due there now
            self.ready.labels(queue).set(0)
            self.oldest.labels(queue).set(0)
        try:
            counts = self.app.outbox.store.counts()
        except Exception as exc:  # noqa: BLE001 - an old schema without the outbox: the rest still counts
            log.debug("outbox backlog not sampled: %s", exc)
        else:
            self.outbox_backlog.set(sum(n for _, state, n in counts if state == "pending"))
        self.sampled_at.set(time.time())

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format."""
        return generate_latest(self.registry)


def _counts(workers: Sequence[Any], relays: Sequence[Any]) -> dict[str, int]:
    """The counters runners keep themselves, summed."""
    return {
        "reconnects": sum(w.stats.reconnects for w in workers) + sum(r.stats.reconnects for r in relays),
        "lost": sum(w.stats.lost for w in workers),
        "rescues": sum(len(getattr(s, "rescued", ())) for w in workers for s in w.services
                       if getattr(s, "name", "") == "rescuer") + sum(r.stats.rescued for r in relays),
        "sent": sum(r.stats.sent for r in relays),
        "retry": sum(r.stats.retried for r in relays),
        "failed": sum(r.stats.failed for r in relays),
        "lost_messages": sum(r.stats.lost for r in relays),
    }


class _RunnerCollector:
    """Counters the worker and relay keep anyway, read at scrape time (no per-job cost)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        with m._lock:
            workers, relays = list(m.workers), list(m.relays)
            retired = dict(m._retired)
        counts = _counts(workers, relays)
        for name, n in retired.items():
            counts[name] += n
        slots = GaugeMetricFamily("skiplock_worker_slots", "Slots of the running workers of this process.")
        slots.add_metric([], sum(w.concurrency for w in workers))
        busy = GaugeMetricFamily("skiplock_worker_slots_busy", "Slots running a claim now.")
        busy.add_metric([], sum(len(w._busy) for w in workers))
        governors = [w.governor for w in workers if getattr(w, "governor", None) is not None]
        limit = GaugeMetricFamily("skiplock_worker_lease_limit",
                                  "Slots the lease governor lets hold a lease at once now (worker/governor.py).")
        limit.add_metric([], sum(g.limit for g in governors))
        held = GaugeMetricFamily("skiplock_worker_leases_held", "The lease governor's permits held now.")
        held.add_metric([], sum(g.held for g in governors))
        reconnects = CounterMetricFamily("skiplock_reconnects", "Database connections lost and made again.")
        reconnects.add_metric([], counts["reconnects"])
        moves = CounterMetricFamily("skiplock_worker_lease_limit_changes",
                                    "How often the lease governor moved its limit (running workers).")
        moves.add_metric([], sum(g.changes for g in governors))
        lost = CounterMetricFamily("skiplock_lease_losses", "Claimed-lease jobs whose finishing write was refused.")
        lost.add_metric([], counts["lost"])
        rescues = CounterMetricFamily("skiplock_rescues", "Expired claimed leases returned to the queue or failed.")
        rescues.add_metric([], counts["rescues"])
        deliveries = CounterMetricFamily("skiplock_outbox_deliveries", "Outbox delivery outcomes.", labels=["outcome"])
        for outcome, key in (("sent", "sent"), ("retry", "retry"), ("failed", "failed"), ("lost", "lost_messages")):
            deliveries.add_metric([outcome], counts[key])
        yield from (slots, busy, limit, held, moves, reconnects, lost, rescues, deliveries)


class Sampler(Service):
    """Samples the queue and outbox gauges every ``interval`` seconds (started by the worker)."""

    name = "metrics-sampler"

    def __init__(self, metrics: Metrics, interval: float = 15.0):
        super().__init__(interval)
        self.metrics = metrics

    def step(self) -> None:
        self.metrics.sample()


# ---- serving -----------------------------------------------------------------------------------

def _authorized(header: str | None, token: str) -> bool:
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


def metrics_asgi_app(app_or_metrics: Any, *, token: str | None) -> Any:
    """An ASGI app serving the metrics (any path, GET). ``token``: the bearer token every request must
    carry (401 otherwise); ``None`` only when the caller authenticates requests itself (the dashboard,
    mounting this behind its own login) -- it must be passed explicitly. Enables metrics on an App."""
    metrics = app_or_metrics if isinstance(app_or_metrics, Metrics) else app_or_metrics.enable_metrics()

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if token is not None:
            headers = dict(scope.get("headers") or [])
            header = headers.get(b"authorization")
            if not _authorized(header.decode("latin-1") if header else None, token):
                await _respond(send, 401, b"unauthorized\n", b"text/plain; charset=utf-8",
                               [(b"www-authenticate", b'Bearer realm="skiplock metrics"')])
                return
        await _respond(send, 200, metrics.exposition(), CONTENT_TYPE_LATEST.encode())

    return asgi


async def _respond(send: Any, status: int, body: bytes, content_type: bytes,
                   extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


def resolve_token(port: int) -> tuple[str, Path | None]:
    """The bearer token of ``--metrics-port``: ``SKIPLOCK_METRICS_TOKEN``, else ``SKIPLOCK_DASHBOARD_TOKEN``,
    else a random one written to a file only this user can read (returned, to be named; the token
    itself is never printed or logged)."""
    for name in TOKEN_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value, None
    import platformdirs

    token = secrets.token_urlsafe(32)
    failure: OSError | None = None
    for where in (platformdirs.user_runtime_dir, platformdirs.user_state_dir):  # no runtime dir: the state dir
        try:
            return token, _write_private(Path(where("skiplock", ensure_exists=False)), f"metrics-{port}.token", token)
        except OSError as exc:
            failure = exc
    assert failure is not None
    raise failure


def _write_private(directory: Path, name: str, token: str) -> Path:
    """``token`` in ``directory/name``, the directory 0700 and the file 0600 (this user's only)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(token + "\n")
    return path


class MetricsServer:
    """``GET /metrics`` over HTTP on ``host:port`` (a daemon thread), bearer token required."""

    def __init__(self, metrics: Metrics, host: str, port: int, token: str):
        if not token:
            raise ValueError("the metrics server needs a token")
        expose = metrics.exposition

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not _authorized(self.headers.get("Authorization"), token):
                    self._send(401, b"unauthorized\n", "text/plain; charset=utf-8",
                               {"WWW-Authenticate": 'Bearer realm="skiplock metrics"'})
                elif self.path.split("?", 1)[0] != "/metrics":
                    self._send(404, b"not found: try /metrics\n", "text/plain; charset=utf-8")
                else:
                    self._send(200, expose(), CONTENT_TYPE_LATEST)

            def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no access log, no tokens
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="skiplock-metrics", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_metrics(app: Any, port: int, host: str = "127.0.0.1", token: str | None = None) -> MetricsServer:
    """Serve ``app``'s metrics at ``http://host:port/metrics`` (enables them); ``token`` required by
    every request (default: :func:`resolve_token`). Returns the started server (``stop()``)."""
    if token is None:
        token, _ = resolve_token(port)
    return MetricsServer(app.enable_metrics(), host, port, token).start()
