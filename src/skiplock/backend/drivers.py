"""What the layers above the seam may ask about a connection the caller hands them, without naming
a driver."""

from __future__ import annotations

import inspect
from typing import Any


def is_async_connection(conn: Any) -> bool:
    """A connection of an async driver (``psycopg.AsyncConnection``): its ``execute`` is a coroutine
    function. The backend then runs the statement steps on it with ``run_async``."""
    return conn is not None and inspect.iscoroutinefunction(getattr(conn, "execute", None))
