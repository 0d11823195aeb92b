"""What a failed attempt leads to, and how its error is written down (pure: no I/O)."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from ..errors import DatabaseError, storable_text
from ..job import Failed, Outcome, Retry, RetryLater
from ..retry import check_delay

if TYPE_CHECKING:
    from ..app import Task

MAX_ERROR_CHARS = 16_000


class ResultNotStorable(ValueError):
    """The handler's return value cannot be stored as the job's result (the attempt fails)."""


def describe(exc: BaseException) -> str:
    """``Type: message`` as storable text, even for an exception whose ``str()`` fails. A statement
    the server refused (``DatabaseError``) is described by its message, which starts with the
    server's error class (``ForeignKeyViolation: ...``)."""
    if isinstance(exc, DatabaseError):
        return storable_text(str(exc))
    try:
        message = str(exc)
    except Exception as failed:  # noqa: BLE001 - a hostile __str__ must not take the slot down
        message = f"<str() failed: {type(failed).__qualname__}>"
    return storable_text(f"{type(exc).__qualname__}: {message}")


def format_error(exc: BaseException) -> str:
    """``Type: message`` then the traceback, bounded in size, as storable text (``storable_text``)."""
    head = describe(exc)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f"{head}\n\n{tb}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n... [truncated] ...\n" + text[-MAX_ERROR_CHARS // 2 :]
    return storable_text(text)


def decide_failure(task: "Task | None", attempt: int, max_attempts: int, error: str,
                   exc: BaseException | None) -> Outcome:
    """Pure: what a failed attempt leads to. Retries use the task's policy (or the delay a
    :class:`Retry` asked for) until max_attempts. A policy that raises, or returns anything but
    None or a valid delay (``retry.check_delay``: infinity, NaN, 1e300, negative, not a number),
    ends the job ``failed``, its error saying why it was not retried: a retry time PostgreSQL
    cannot store would otherwise fail the outcome's write."""
    if task is None or attempt >= max_attempts:
        return Failed(error)
    if isinstance(exc, Retry) and exc.in_ is not None:
        delay: Any = exc.in_  # checked when the Retry was made
    else:
        try:
            delay = task.retry(attempt, exc)
        except Exception as policy_error:  # noqa: BLE001 - a policy bug is recorded, not raised in the slot
            return Failed(f"{error}\n\nnot retried: the task's retry policy raised {describe(policy_error)}")
        if delay is None:
            return Failed(error)
    try:
        return RetryLater(check_delay(delay, "a retry delay"), error)
    except ValueError as bad:
        return Failed(f"{error}\n\nnot retried: the task's retry policy returned an invalid delay: {bad}")
