"""Background services a worker runs besides its slots: the periodic scheduler and the pruner."""

from .service import Service

__all__ = ["Service"]
