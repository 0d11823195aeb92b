"""How the relay hands a claimed batch to its sink; each message's result is None (delivered) or the
exception it failed with (an outcome to record, never raised -- except a lost database session in a
transaction lease, which ends the batch).

- :func:`deliver_external`: concurrently on the relay's thread pool, outside any transaction; the
  sink's ``deliver_batch(messages)`` when it has one (one call, one result per message), else
  ``deliver(message)`` each. ``extend`` (a claimed lease) is called every ``every`` seconds while
  deliveries are still running, so a slow batch is not rescued from under the relay.
- :func:`deliver_in_transaction`: a transactional sink writes on the lease's connection: the batch
  first, all or nothing; if that fails, message by message under a savepoint each, so one bad
  message fails alone (:meth:`~skiplock.backend.outbox_base.OutboxLease.attempt`).
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Optional

from ..backend.outbox_base import Message, OutboxLease

Result = Optional[BaseException]


def deliver_external(sink: Any, pool: cf.ThreadPoolExecutor, messages: list[Message],
                     extend: Callable[[], None] | None, every: float) -> list[Result]:
    batch_fn = getattr(sink, "deliver_batch", None)
    if batch_fn is not None:
        whole = pool.submit(_call_batch, sink, batch_fn, messages)
        _wait({whole}, extend, every)
        return whole.result()
    each = [pool.submit(_call, sink, m) for m in messages]
    _wait(set(each), extend, every)
    return [f.result() for f in each]


def deliver_in_transaction(sink: Any, lease: OutboxLease, messages: list[Message]) -> list[Result]:
    batch_fn = getattr(sink, "deliver_batch", None)
    if batch_fn is not None and len(messages) > 1:
        if lease.attempt(lambda conn: batch_fn(messages, conn)) is None:
            return [None] * len(messages)
    results: list[Result] = []
    for m in messages:
        def one(conn: Any, m: Message = m) -> None:
            sink.deliver(m, conn)
        results.append(lease.attempt(one))
    return results


def _wait(futures: set[cf.Future[Any]], extend: Callable[[], None] | None, every: float) -> None:
    pending = futures
    while pending:
        _, pending = cf.wait(pending, timeout=every if extend else None)
        if pending and extend is not None:
            extend()


def _call(sink: Any, message: Message) -> Result:
    try:
        sink.deliver(message)
        return None
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome to record
        return exc


def _call_batch(sink: Any, batch_fn: Any, messages: list[Message]) -> list[Result]:
    try:
        results = list(batch_fn(messages))
    except Exception as exc:  # noqa: BLE001 - the whole batch failed alike
        return [exc] * len(messages)
    if len(results) != len(messages):
        error = RuntimeError(f"{sink!r}.deliver_batch returned {len(results)} results for {len(messages)} messages")
        return [error] * len(messages)
    return results
