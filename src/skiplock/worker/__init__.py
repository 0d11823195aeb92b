"""The worker process: claim loop, executor, shutdown."""

from .loop import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
