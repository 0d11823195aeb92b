"""Exceptions skiplock raises; each says what went wrong and what to do about it."""

from __future__ import annotations


class SkiplockError(Exception):
    """Base class of every error skiplock raises on purpose."""


class ConfigurationError(SkiplockError):
    """The DSN, data directory or another setting cannot be used."""


class DatabaseUnavailable(SkiplockError):
    """The database cannot be reached (wrong DSN, server down, network)."""


class SchemaError(SkiplockError):
    """The database has no skiplock schema, or one of a version this code does not know."""


class InvalidJob(SkiplockError, ValueError):
    """A job cannot be enqueued as given (arguments not JSON, too large, bad option). Nothing was written."""


class UnknownTask(SkiplockError, KeyError):
    """No task of that name is registered with the app."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown task"


class JobNotFound(SkiplockError, LookupError):
    """No job has that id."""


class DuplicateJob(SkiplockError):
    """A queued or running job already holds this unique key (raised only with ``on_conflict="raise"``).
    ``existing_id`` is that job's id; None when the holder is an earlier item of the same
    ``enqueue_many`` call (it was not inserted either)."""

    def __init__(self, message: str, existing_id: int | None):
        super().__init__(message)
        self.existing_id = existing_id


class UnknownQueue(SkiplockError, LookupError):
    """No job has ever used that queue (pass ``force=True`` to pause it anyway)."""


class JobFailed(SkiplockError):
    """The job a caller waited on ended ``failed`` (or ``cancelled``); ``.job`` has its errors."""

    def __init__(self, message: str, job: object):
        super().__init__(message)
        self.job = job


class WaitTimeout(SkiplockError, TimeoutError):
    """The job did not finish within the time given to ``wait``."""
