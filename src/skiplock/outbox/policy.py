"""Pure delivery decisions: what one attempt's result means for a message (sent, retry at T, failed).

No database here: the relay decides with :func:`decide`, then writes all of a batch's outcomes in
one fenced statement. Tested without a database in tests/unit.
"""

from __future__ import annotations

import traceback

from ..backend.outbox_base import Finish, Message
from ..retry import Exponential, RetryPolicy
from .errors import DeliveryError, PermanentDeliveryError, RetryableDeliveryError

# Per message: 1 s, 2 s, 4 s, ... capped at 10 minutes, each +/- 25 % so a receiver that comes back
# after an outage is not hit by every message at the same instant.
DEFAULT_RETRY: RetryPolicy = Exponential(base=1.0, factor=2.0, max_delay=600.0, jitter=0.25)
MAX_ERROR_CHARS = 4000
MAX_DELAY = 100 * 365 * 86400.0


def describe(exc: BaseException) -> str:
    """A sink's DeliveryError is its message (it says what happened); anything else is
    ``Type: message`` and the traceback (a bug or an unexpected failure in the sink). Bounded in size."""
    if isinstance(exc, DeliveryError):
        head = str(exc) or type(exc).__qualname__
    else:
        head = f"{type(exc).__qualname__}: {exc}\n\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(head) > MAX_ERROR_CHARS:
        head = head[: MAX_ERROR_CHARS // 2] + "\n... [truncated] ...\n" + head[-MAX_ERROR_CHARS // 2:]
    return head


def decide(message: Message, error: BaseException | None, retry: RetryPolicy = DEFAULT_RETRY) -> Finish:
    """The outcome of one delivery attempt of ``message``:

    - no error: ``sent``;
    - :class:`PermanentDeliveryError`: ``failed`` now (retrying cannot help);
    - the last attempt (``attempt >= max_attempts``), or the policy returning None: ``failed``;
    - otherwise ``pending`` again after the policy's delay (at least a receiver's ``retry_after``).
    The error text is kept on the message either way.
    """
    if error is None:
        return Finish(message.id, "sent")
    text = describe(error)
    if isinstance(error, PermanentDeliveryError):
        return Finish(message.id, "failed", error=f"permanent failure on attempt {message.attempt}: {text}")
    if message.attempt >= message.max_attempts:
        return Finish(message.id, "failed", error=f"gave up after attempt {message.attempt}/{message.max_attempts}: {text}")
    delay = retry(message.attempt, error)
    if delay is None:
        return Finish(message.id, "failed", error=f"retry policy gave up after attempt {message.attempt}: {text}")
    if isinstance(error, RetryableDeliveryError) and error.retry_after is not None:
        delay = max(delay, error.retry_after)
    return Finish(message.id, "pending", delay=min(max(0.0, float(delay)), MAX_DELAY),
                  error=f"attempt {message.attempt}/{message.max_attempts}: {text}")
