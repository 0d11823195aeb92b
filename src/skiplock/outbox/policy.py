"""Pure delivery decisions: what one attempt's result means for a message (sent, retry at T, failed).

No database here: the relay decides with :func:`decide`, then writes all of a batch's outcomes in
one fenced statement. Tested without a database in tests/unit.
"""

from __future__ import annotations

import traceback

from ..backend.outbox_base import Finish, Message
from ..errors import storable_text
from ..retry import MAX_DELAY, Exponential, RetryPolicy, check_delay
from .errors import DeliveryError, PermanentDeliveryError, RetryableDeliveryError

# Per message: 1 s, 2 s, 4 s, ... capped at 10 minutes, each +/- 25 % so a receiver that comes back
# after an outage is not hit by every message at the same instant.
DEFAULT_RETRY: RetryPolicy = Exponential(base=1.0, factor=2.0, max_delay=600.0, jitter=0.25)
MAX_ERROR_CHARS = 4000


def describe(exc: BaseException) -> str:
    """A sink's DeliveryError is its message (it says what happened); anything else is
    ``Type: message`` and the traceback (a bug or an unexpected failure in the sink). Bounded in size,
    and storable text whatever the sink said (a NUL or a lone surrogate is escaped)."""
    if isinstance(exc, DeliveryError):
        head = str(exc) or type(exc).__qualname__
    else:
        head = f"{type(exc).__qualname__}: {exc}\n\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(head) > MAX_ERROR_CHARS:
        head = head[: MAX_ERROR_CHARS // 2] + "\n... [truncated] ...\n" + head[-MAX_ERROR_CHARS // 2:]
    return storable_text(head)


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
    try:
        delay = retry(message.attempt, error)
        if delay is None:
            return Finish(message.id, "failed", error=f"retry policy gave up after attempt {message.attempt}: {text}")
        delay = check_delay(delay, "the retry policy's delay")
    except Exception as exc:  # noqa: BLE001 - a broken policy fails the message, saying why
        return Finish(message.id, "failed", error=storable_text(
            f"not retried: the retry policy failed after attempt {message.attempt} ({type(exc).__name__}: {exc}); "
            f"the delivery error was: {text}"))
    if isinstance(error, RetryableDeliveryError) and error.retry_after is not None:
        delay = max(delay, min(error.retry_after, MAX_DELAY))  # a receiver's Retry-After, capped
    return Finish(message.id, "pending", delay=delay, error=f"attempt {message.attempt}/{message.max_attempts}: {text}")
