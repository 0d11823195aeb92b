"""skiplock: a PostgreSQL job queue on SELECT ... FOR UPDATE SKIP LOCKED, where the transaction is the lease."""

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

__all__ = [
    "App", "AsyncApp", "Task", "Job", "JobState", "Worker", "Retry", "Snooze", "Cancel",
    "Exponential", "Constant", "Linear",
    "SkiplockError", "ConfigurationError", "DatabaseUnavailable", "InvalidJob", "JobNotFound", "SchemaError",
    "UnknownTask", "UnknownQueue", "DuplicateJob", "JobFailed", "WaitTimeout",
]
