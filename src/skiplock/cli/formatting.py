"""How the command line writes times, durations and JSON -- one way everywhere.

- A time is ISO 8601 in UTC to the second: ``2026-12-01T17:42:40Z`` (tables and JSON alike).
- A time in the past, in tables, is also how long ago: ``3 s ago``, ``5 min ago``, ``2 h ago``.
- A duration in tables: ``0.4 s``, ``3 s``, ``2 min 5 s``, ``1 h 02 min``, ``3 d 4 h``; in JSON, seconds.
- JSON: dataclasses become objects, enums their value, UUIDs strings, times as above.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from datetime import date, datetime, timedelta, timezone
from typing import Any


def when(value: datetime | None) -> str:
    """``2026-12-01T17:42:40Z``, or "" for None (a time without a zone is taken as UTC)."""
    if value is None:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def took(value: timedelta | float | None) -> str:
    """A duration: ``0.4 s``, ``3 s``, ``2 min 5 s``, ``1 h 02 min``, ``3 d 4 h``; "" for None."""
    if value is None:
        return ""
    seconds = max(0.0, value.total_seconds() if isinstance(value, timedelta) else float(value))
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def ago(value: timedelta | None) -> str:
    """How long ago: ``3 s ago`` (whole seconds below a minute), ``2 min 5 s ago``; "" for None."""
    if value is None:
        return ""
    seconds = max(0.0, value.total_seconds())
    return f"{int(seconds)} s ago" if seconds < 60 else f"{took(value)} ago"


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (see the module's docstring)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    uuid = sys.modules.get("uuid")  # a UUID exists only if its module was imported
    if uuid is not None and isinstance(value, uuid.UUID):
        return str(value)
    return value
