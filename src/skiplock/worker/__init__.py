"""The worker process: claim loop, executor, shutdown.

``Worker`` and ``WorkerStats`` are imported on first use (PEP 562): importing a submodule such as
``skiplock.worker.presence`` (the read model and ``skiplock status`` do) does not load the claim loop."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'skiplock.worker' has no attribute {name!r}")
