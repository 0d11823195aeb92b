"""The database seam: job operations, each backend owning its SQL (PostgreSQL now, MySQL later).

:func:`open_backend` picks the backend from a DSN's scheme; everything above ``skiplock.backend``
is typed against :class:`Backend`."""

from .base import Backend, ClaimedJob
from .factory import open_backend

__all__ = ["Backend", "ClaimedJob", "open_backend"]
