"""Seeing what skiplock does: user hooks (:mod:`.hooks`), the worker's log lines (:mod:`.reporting`),
Prometheus metrics (:mod:`.metrics`, the ``metrics`` extra), JSON logs (:mod:`.logs`) and
OpenTelemetry traces (:mod:`.tracing`, the ``otel`` extra). See docs/observability.md.

Importing this package imports neither prometheus_client nor OpenTelemetry."""

from .hooks import EVENTS, Hooks, JobEvent

__all__ = ["EVENTS", "Hooks", "JobEvent"]
