"""The PostgreSQL backend."""

from .backend import PostgresBackend

__all__ = ["PostgresBackend"]
