"""The worker process: claim loop, executor, shutdown.

``Worker`` and ``WorkerStats`` are imported on first use (PEP 562): importing a submodule such as
``skiplock.worker.presence`` (the read model and ``skiplock status`` do) does not load the claim loop."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Worker
    from .stats import WorkerStats

__all__ = ["Worker", "WorkerStats"]


def __getattr__(name: str) -> Any:
    if name == "Worker":
        from .loop import Worker

        return Worker
    if name == "WorkerStats":
        from .stats import WorkerStats

        return WorkerStats
    raise AttributeError(f"module 'skiplock.worker' has no attribute {name!r}")
