"""skiplock: a PostgreSQL job queue on SELECT ... FOR UPDATE SKIP LOCKED, where the transaction is the lease."""

from .app import App, Task
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidJob,
    JobNotFound,
    SchemaError,
    SkiplockError,
    UnknownTask,
)
from .job import Job, JobState
from .retry import Constant, Exponential, Linear
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "App", "Task", "Job", "JobState", "Worker",
    "Exponential", "Constant", "Linear",
    "SkiplockError", "ConfigurationError", "DatabaseUnavailable", "InvalidJob", "JobNotFound", "SchemaError",
    "UnknownTask",
]
