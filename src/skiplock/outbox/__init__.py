"""The transactional outbox: ``put`` messages in your transaction, a relay delivers them at least once.

See docs/outbox.md. Public names: :class:`Outbox` (``app.outbox``), :class:`Relay` (``app.relay``),
the sinks (:class:`HttpSink`, :class:`EnqueueJobSink`, the :class:`Sink` protocol), the delivery
errors a sink raises, and :class:`Message` (what a sink receives).
"""

from ..backend.outbox_base import Message, MessageRecord
from .errors import DeliveryError, InvalidMessage, MessageNotFound, PermanentDeliveryError, RetryableDeliveryError
from .relay import Relay, RelayStats
from .sinks import IDEMPOTENCY_HEADER, EnqueueJobSink, HttpSink, Sink, TransactionalSink
from .writer import MessageRef, Outbox

__all__ = [
    "Outbox", "MessageRef", "Message", "MessageRecord", "Relay", "RelayStats",
    "Sink", "TransactionalSink", "HttpSink", "EnqueueJobSink", "IDEMPOTENCY_HEADER",
    "DeliveryError", "PermanentDeliveryError", "RetryableDeliveryError", "InvalidMessage", "MessageNotFound",
]
