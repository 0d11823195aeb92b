"""skiplock: a PostgreSQL job queue on SELECT ... FOR UPDATE SKIP LOCKED, where the transaction is the lease.

The public names below are imported on first use (PEP 562), so ``import skiplock`` -- and the command
line, which is a submodule -- costs only what is used: ``skiplock --help`` never loads the worker,
asyncio or the database driver. ``from skiplock import App`` and ``skiplock.App`` work as always.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .aio import AsyncApp
    from .app import App, Task
    from .errors import (
        ConfigurationError,
        DatabaseUnavailable,
        DuplicateJob,
        InvalidJob,
        JobFailed,
        JobNotFound,
        SchemaError,
        SkiplockError,
        UnknownQueue,
        UnknownTask,
        WaitTimeout,
    )
    from .job import Cancel, Job, JobState, Retry, Snooze
    from .retry import Constant, Exponential, Linear
    from .worker import Worker

__version__ = "0.1.0"

# Each public name and the module that defines it.
_WHERE = {
    "AsyncApp": ".aio", "App": ".app", "Task": ".app", "Worker": ".worker",
    "Cancel": ".job", "Job": ".job", "JobState": ".job", "Retry": ".job", "Snooze": ".job",
    "Constant": ".retry", "Exponential": ".retry", "Linear": ".retry",
    **{name: ".errors" for name in ("ConfigurationError", "DatabaseUnavailable", "DuplicateJob", "InvalidJob",
                                    "JobFailed", "JobNotFound", "SchemaError", "SkiplockError", "UnknownQueue",
                                    "UnknownTask", "WaitTimeout")},
}

__all__ = [
    "App", "AsyncApp", "Task", "Job", "JobState", "Worker", "Retry", "Snooze", "Cancel",
    "Exponential", "Constant", "Linear",
    "SkiplockError", "ConfigurationError", "DatabaseUnavailable", "InvalidJob", "JobNotFound", "SchemaError",
    "UnknownTask", "UnknownQueue", "DuplicateJob", "JobFailed", "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'skiplock' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
