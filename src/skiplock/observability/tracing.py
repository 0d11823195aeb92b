"""OpenTelemetry traces (``pip install 'skiplock[otel]'``; off by default): ``app.enable_tracing()``.

Spans (tracer ``skiplock``):

- ``skiplock enqueue`` (PRODUCER) around ``enqueue``/``enqueue_many`` (``AsyncApp``'s too, on an
  ``AsyncConnection`` as well), a child of whatever span is current in the caller (a web request's, say). The trace context (the global propagator's carrier,
  W3C ``traceparent`` by default) is stored with the jobs (table ``job_traces``, migration 0011): in the
  caller's transaction with ``conn=...``, else just after the enqueue's own commit -- a worker that
  claims the job in between starts a new trace for it.
- ``skiplock claim`` (INTERNAL) around each claim statement of a worker slot (jobs claimed: attribute);
  ``skiplock flow claim`` around each flow claim (flow control's; its tries and slots inside).
- ``skiplock execute <task>`` (CONSUMER) around each handler call, a **child of the enqueue span**
  (the stored context is taken, in the claim's transaction, by the attempt that claims it), and the
  current span while the handler runs: spans of the handler's own calls (an instrumented HTTP client)
  are its children. So one trace shows request -> enqueue -> execute -> downstream call. Its status is
  ERROR for a failed attempt. Every attempt reads the stored context, so a retry's execute span is a
  child of the enqueue span too; the context is deleted once an attempt ends done, failed or cancelled.

- ``skiplock outbox put <topic>`` (PRODUCER) around ``outbox.put``/``put_many`` (and ``put_async`` on
  an ``AsyncConnection``); its context is stored
  with the messages (``outbox_traces``, migration 14, in the put's transaction), and
  ``skiplock outbox deliver <topic>`` (CLIENT) around a relay's delivery of one batch **links** to
  the put span of each message it delivers.

Attributes: ``messaging.system`` = ``skiplock``, ``messaging.destination.name`` (the queue),
``skiplock.task``, ``skiplock.job_id``, ``skiplock.attempt``, ``skiplock.outcome`` -- no arguments.

With tracing off nothing here is imported and the enqueue and claim statements are unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Iterator, Sequence

try:
    from opentelemetry import context as otel_context, propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("skiplock's tracing needs OpenTelemetry: pip install 'skiplock[otel]'") from exc

if TYPE_CHECKING:
    from ..backend.base import ClaimedJob, Lease

SYSTEM = "skiplock"
# Outcomes after which no attempt of the job follows: its stored trace context is forgotten.
FINAL = ("done", "failed", "cancelled")
log = logging.getLogger("skiplock.tracing")


class Tracing:
    """An App's tracer and trace-context store."""

    def __init__(self, app: Any, tracer_provider: Any = None):
        self.app = app
        self.tracer = trace.get_tracer("skiplock", tracer_provider=tracer_provider)
        self._store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:
            make = getattr(self.app.backend, "trace_store", None)
            self._store = make() if make is not None else False
        return self._store or None

    # ---- producing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def enqueue(self, task: str, queue: str, count: int) -> Iterator[Any]:
        """The enqueue span; yields a function ``keep(ids, conn)`` storing the trace context for ids."""
        attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.destination.name": queue,
                                      "skiplock.task": task, "messaging.batch.message_count": count}
        with self.tracer.start_as_current_span(f"skiplock enqueue {task}", kind=SpanKind.PRODUCER,
                                               attributes=attributes):
            def keep(ids: Sequence[int], conn: Any = None) -> None:
                store = self.store
                carrier: dict[str, str] = {}
                propagate.inject(carrier)
                if store is not None and carrier and ids:
                    store.store(ids, carrier, conn)

            yield keep

    @contextlib.contextmanager
    def enqueue_async(self, task: str, queue: str, count: int) -> Iterator[Any]:
        """:meth:`enqueue` for ``AsyncApp`` on an ``AsyncConnection``: yields a coroutine function
        ``keep(ids, aconn)`` storing the trace context in the caller's transaction. (The span is
        current in the coroutine's context: OpenTelemetry's context is a contextvar.)"""
        attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.destination.name": queue,
                                      "skiplock.task": task, "messaging.batch.message_count": count}
        with self.tracer.start_as_current_span(f"skiplock enqueue {task}", kind=SpanKind.PRODUCER,
                                               attributes=attributes):
            async def keep(ids: Sequence[int], aconn: Any) -> None:
                store = self.store
                carrier: dict[str, str] = {}
                propagate.inject(carrier)
                if store is not None and carrier and ids and hasattr(store, "store_async"):
                    await store.store_async(ids, carrier, aconn)

            yield keep

    # ---- working ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self, slot: str, name: str = "skiplock claim") -> Iterator[Any]:
        with self.tracer.start_as_current_span(name, kind=SpanKind.INTERNAL,
                                               attributes={"messaging.system": SYSTEM, "skiplock.slot": slot}) as span:
            yield span

    def take(self, lease: "Lease", jobs: "Sequence[ClaimedJob]") -> dict[int, dict[str, str]]:
        """The stored contexts of the jobs a claim locked (consumed in the lease transaction)."""
        store = self.store
        if store is None:
            return {}
        return store.take(lease, [job.id for job in jobs])

    def start_execute(self, claimed: "ClaimedJob", attempt: int, carrier: dict[str, str] | None) -> tuple[Any, Any, int]:
        """Start the execute span (current until :meth:`end_execute`); returns what ``end_execute`` needs."""
        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"skiplock execute {claimed.task}", context=parent, kind=SpanKind.CONSUMER,
            attributes={"messaging.system": SYSTEM, "messaging.destination.name": claimed.queue,
                        "skiplock.task": claimed.task, "skiplock.job_id": claimed.id, "skiplock.attempt": attempt})
        token = otel_context.attach(trace.set_span_in_context(span))
        return span, token, claimed.id

    def end_execute(self, started: tuple[Any, Any, int], outcome: str, error: str | None) -> None:
        """End the execute span; after a final outcome (done, failed, cancelled) forget the job's
        stored context (a retry or snooze keeps it: the next attempt continues the same trace).
        Never raises for the store: tracing cannot break a job."""
        span, token, job_id = started
        span.set_attribute("skiplock.outcome", outcome)
        if outcome in ("retry", "failed"):
            span.set_status(Status(StatusCode.ERROR, (error or "").split("\n", 1)[0][:500]))
        otel_context.detach(token)
        span.end()
        store = self.store
        if outcome in FINAL and store is not None and hasattr(store, "forget"):
            try:
                store.forget(job_id)
            except Exception as exc:  # noqa: BLE001 - a row left behind costs a few bytes; the job goes on
                log.debug("trace context of job %s not forgotten: %s", job_id, exc)

    # ---- outbox ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def outbox_put(self, topic: str, count: int) -> Iterator[dict[str, str] | None]:
        """The outbox put span (PRODUCER), a child of the caller's current span; yields its trace
        context as a carrier (None if the propagator made none), stored with the messages
        (``outbox_traces``, migration 14) so their deliver span links back to this one."""
        with self.tracer.start_as_current_span(
                f"skiplock outbox put {topic}", kind=SpanKind.PRODUCER,
                attributes={"messaging.system": SYSTEM, "messaging.destination.name": topic,
                            "messaging.batch.message_count": count}):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier or None

    @contextlib.contextmanager
    def outbox_deliver(self, topic: str, count: int, carriers: Sequence[dict[str, str]] = ()) -> Iterator[Any]:
        """A relay's delivery of one claimed batch; yields ``done(results)`` (None: delivered). The
        span links to the put span of each message (``carriers``: their stored contexts; a batch
        holds messages of many puts, so they are links, not one parent)."""
        links: list[Any] = []
        for carrier in carriers:
            context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
            if context.is_valid and all(link.context != context for link in links):
                links.append(trace.Link(context))
        with self.tracer.start_as_current_span(
                f"skiplock outbox deliver {topic}", kind=SpanKind.CLIENT, links=links,
                attributes={"messaging.system": SYSTEM, "messaging.destination.name": topic,
                            "messaging.batch.message_count": count}) as span:
            def done(results: Sequence[BaseException | None]) -> None:
                failed = sum(result is not None for result in results)
                span.set_attribute("skiplock.outbox.failed", failed)
                if failed:
                    span.set_status(Status(StatusCode.ERROR, f"{failed} of {len(results)} message(s) failed"))

            yield done
