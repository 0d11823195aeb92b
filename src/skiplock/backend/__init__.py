"""The database seam: job operations, each backend owning its SQL (PostgreSQL now, MySQL later)."""

from .base import Backend, ClaimedJob

__all__ = ["Backend", "ClaimedJob"]
