"""What the layers above the seam may ask about a connection the caller hands them, without naming
a driver."""

from __future__ import annotations

import inspect
from typing import Any


def is_async_connection(conn: Any) -> bool:
    """A connection of an asyncio driver: its ``execute`` (``psycopg.AsyncConnection``) or its
    ``commit`` (asyncmy's and aiomysql's connections, which have no ``execute``) is a coroutine
    function. The backend then runs the statement steps on it with ``run_async``."""
    return conn is not None and any(inspect.iscoroutinefunction(getattr(conn, name, None))
                                    for name in ("execute", "commit"))
