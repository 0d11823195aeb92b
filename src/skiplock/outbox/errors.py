"""Errors of the outbox: bad input to the writer, unknown messages, and how a sink reports a failed delivery."""

from __future__ import annotations

from ..errors import SkiplockError


class InvalidMessage(SkiplockError, ValueError):
    """A message cannot be stored as given (empty topic, payload not JSON, ...). Checked before any
    SQL is sent, so nothing was written and the caller's transaction is still usable."""


class MessageNotFound(SkiplockError, LookupError):
    """No outbox message has that id."""


class DeliveryError(Exception):
    """Raised by a sink: the message was not delivered. Any other exception counts as retryable."""


class PermanentDeliveryError(DeliveryError):
    """Retrying cannot help (the receiver rejected the message, e.g. HTTP 4xx): the message ends
    ``failed`` at once, with this error kept, and waits for a redrive."""


class RetryableDeliveryError(DeliveryError):
    """Try again later (HTTP 5xx, a timeout, a refused connection). ``retry_after`` (seconds), when
    the receiver asked for one, is the least delay before the next attempt."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
