"""Where the relay delivers messages: the sink interface, an HTTP webhook and "enqueue a skiplock job".

A sink is any object with ``deliver(message)``. Two kinds:

- **External** (``transactional = False``, the default): the effect happens outside the database
  (an HTTP call, a Kafka produce). The relay calls ``deliver(message)`` from its delivery threads,
  after the claim has committed. Return = delivered; raise :class:`PermanentDeliveryError` when a
  retry cannot help; any other exception (or :class:`RetryableDeliveryError`) = retry with backoff.
  A sink that can send a whole batch at once (a Kafka producer's ``flush``) may also define
  ``deliver_batch(messages) -> list[BaseException | None]`` (one result per message, in order); the
  relay then calls that once per batch instead. Delivery is at least once: the receiver
  deduplicates on ``message.idempotency_key`` (see :mod:`skiplock.dedup`).
- **Transactional** (``transactional = True``): the effect is a write in the same database, made
  on the relay's own connection inside the transaction that claimed the message and marks it sent,
  so it happens exactly once. ``deliver(message, conn)``; optionally ``deliver_batch(messages, conn)``
  (all or nothing: if it raises, the relay retries the messages one by one, each under a savepoint).

Adding Kafka, NATS or Redis later is a new class here (or in your code) with ``deliver``; the relay
does not change. Optional ``close()`` is called when the relay stops.
"""

from __future__ import annotations

import email.utils
import json
import math
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable
from urllib.parse import quote, urlsplit

from ..backend.outbox_base import Message
from ..errors import ConfigurationError, InvalidJob
from .errors import PermanentDeliveryError, RetryableDeliveryError

if TYPE_CHECKING:
    import httpx

    from ..app import App

IDEMPOTENCY_HEADER = "Idempotency-Key"
TOPIC_HEADER = "Skiplock-Topic"
KEY_HEADER = "Skiplock-Key"
MESSAGE_ID_HEADER = "Skiplock-Message-Id"
ATTEMPT_HEADER = "Skiplock-Attempt"
# Percent-encode only what cannot go in a header value (non-ASCII, controls, space, '%').
_HEADER_SAFE = "!#$&'()*+,/:;=?@[]~^`|{}<>\"\\"


@runtime_checkable
class Sink(Protocol):
    """An external sink: ``deliver`` returns when the message is delivered, raises otherwise."""

    def deliver(self, message: Message) -> None: ...


class TransactionalSink(Protocol):
    """A sink whose effect is a database write on the relay's transaction (exactly once)."""

    transactional: ClassVar[bool]

    def deliver(self, message: Message, conn: Any) -> None: ...


def is_transactional(sink: Any) -> bool:
    return bool(getattr(sink, "transactional", False))


def check_sink(sink: Any) -> Any:
    if not callable(getattr(sink, "deliver", None)) or isinstance(sink, type):
        raise ConfigurationError(f"a sink needs a deliver(message) method; got {sink!r}")
    return sink


def _header_value(text: str) -> str:
    return quote(text, safe=_HEADER_SAFE)


def _http_date(value: str) -> datetime | None:
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)  # "-0000": UTC


def parse_retry_after(value: str | None, now: datetime, limit: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 10.2.3): delay-seconds or an HTTP-date
    (``Wed, 21 Oct 2026 07:28:00 GMT``; the obsolete RFC 850 and asctime forms too), measured from
    ``now`` and clamped to [0, ``limit``]: a date already past asks for no extra wait, one further than
    ``limit`` waits ``limit``. None if absent or unparseable (the retry policy alone decides)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        when = _http_date(value)
        if when is None:
            return None
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), limit)


class HttpSink:
    """POSTs each message's payload as JSON to a webhook.

    Headers: ``Idempotency-Key`` (the message's idempotency key, the same on every attempt: the
    receiver deduplicates on it), ``Skiplock-Topic``, ``Skiplock-Key`` (if the message has an
    ordering key; topic and key are percent-encoded where a header cannot carry them as they are),
    ``Skiplock-Message-Id``, ``Skiplock-Attempt`` and your ``headers``.

    Outcomes: 2xx delivered; 408, 425, 429 and 5xx retryable (a ``Retry-After``, in seconds or as an
    HTTP-date, is the least delay before the next attempt, clamped to ``max_retry_after`` seconds);
    any other 4xx permanent (the message ends ``failed`` at once); 3xx permanent (redirects are not
    followed: configure the final URL); a timeout or a connection error retryable. ``timeout`` bounds connecting, each read and each write, so a
    receiver that hangs costs at most that before the attempt counts as failed.

    ``url`` may be a function of the message (route by topic). The underlying ``httpx.Client`` is
    shared by the relay's delivery threads (it is thread-safe) and keeps connections alive.
    """

    transactional: ClassVar[bool] = False

    def __init__(self, url: str | Callable[[Message], str], *, timeout: float = 10.0,
                 headers: Mapping[str, str] | None = None, client: "httpx.Client | None" = None,
                 max_connections: int = 64, max_retry_after: float = 86400.0):
        import httpx

        if isinstance(url, str):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigurationError(f"webhook URL must be an http:// or https:// URL, got {url!r}")
        elif not callable(url):
            raise ConfigurationError(f"url must be a string or a function of the message, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise ConfigurationError(f"timeout must be a number of seconds in (0, 3600], got {timeout!r}")
        if (isinstance(max_retry_after, bool) or not isinstance(max_retry_after, (int, float))
                or not 0 <= max_retry_after <= 365 * 86400):
            raise ConfigurationError(f"max_retry_after must be a number of seconds in [0, 31536000], got {max_retry_after!r}")
        self.max_retry_after = float(max_retry_after)
        self.url = url
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self._own_client = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(self.timeout), follow_redirects=False,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    def __repr__(self) -> str:
        return f"HttpSink({self.url!r}, timeout={self.timeout:g})"

    def deliver(self, message: Message) -> None:
        import httpx

        url = self.url(message) if callable(self.url) else self.url
        headers = {**self.headers, "Content-Type": "application/json",
                   IDEMPOTENCY_HEADER: message.idempotency_key, TOPIC_HEADER: _header_value(message.topic),
                   MESSAGE_ID_HEADER: str(message.id), ATTEMPT_HEADER: str(message.attempt)}
        if message.key is not None:
            headers[KEY_HEADER] = _header_value(message.key)
        body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        try:
            response = self.client.post(url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise RetryableDeliveryError(f"no response within {self.timeout:g}s ({type(exc).__name__}) "
                                         f"from POST {url}") from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise PermanentDeliveryError(f"cannot POST {url}: {exc}") from None
        except httpx.TransportError as exc:
            raise RetryableDeliveryError(f"{type(exc).__name__}: {exc} (POST {url})") from None
        status = response.status_code
        if 200 <= status < 300:
            return
        detail = f"HTTP {status} {response.reason_phrase} from POST {url}"
        snippet = response.text[:300].strip() if response.content else ""
        if snippet:
            detail += f": {snippet}"
        if status >= 500 or status in (408, 425, 429):
            # A date is measured from the response's own Date when it has one: the receiver's clock
            # set both, so a skew between its clock and ours does not shift the wait.
            now = _http_date(response.headers.get("date") or "") or datetime.now(timezone.utc)
            retry_after = parse_retry_after(response.headers.get("retry-after"), now, self.max_retry_after)
            raise RetryableDeliveryError(detail, retry_after=retry_after)
        raise PermanentDeliveryError(detail)

    def close(self) -> None:
        if self._own_client:
            self.client.close()


class EnqueueJobSink:
    """Fans messages out into skiplock jobs, in the same database and the same transaction that
    marks them sent: no external effect, so each message becomes exactly one job.

    ``task``: the job's task name, or a function of the message returning it [the message's
    topic]. ``args``: a function of the message returning the job's keyword arguments [the payload,
    which must then be a JSON object]. ``queue``, ``priority`` and ``max_attempts`` as for
    :meth:`App.enqueue` (defaults: the task's, when ``app`` has it registered). A message whose job
    cannot be built (payload not an object, unknown option) ends ``failed`` at once.
    """

    transactional: ClassVar[bool] = True

    def __init__(self, app: "App", task: str | Callable[[Message], str] | None = None, *,
                 args: Callable[[Message], Mapping[str, Any]] | None = None, queue: str | None = None,
                 priority: int | None = None, max_attempts: int | None = None):
        self.app = app
        self.task = task
        self.args = args
        self.options: dict[str, Any] = {k: v for k, v in (("queue", queue), ("priority", priority),
                                                           ("max_attempts", max_attempts)) if v is not None}

    def __repr__(self) -> str:
        return f"EnqueueJobSink(task={self.task!r})"

    def _job(self, message: Message) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
        task = self.task(message) if callable(self.task) else (self.task or message.topic)
        if self.args is not None:
            args = self.args(message)
        elif isinstance(message.payload, Mapping):
            args = message.payload
        else:
            raise PermanentDeliveryError(f"payload is a {type(message.payload).__name__}, not a JSON object: it cannot "
                                         "be a job's keyword arguments (give EnqueueJobSink(args=...))")
        return task, args, self.options

    def deliver_batch(self, messages: Sequence[Message], conn: Any) -> None:
        """All messages' jobs in one INSERT on the relay's transaction."""
        try:
            self.app.enqueue_many([self._job(m) for m in messages], conn=conn)
        except InvalidJob as exc:
            raise PermanentDeliveryError(f"cannot enqueue a job for this message: {exc}") from None

    def deliver(self, message: Message, conn: Any) -> None:
        self.deliver_batch([message], conn)
