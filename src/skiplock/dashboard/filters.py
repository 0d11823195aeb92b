"""What the dashboard's templates and forms share: the Jinja filters (times, durations, pretty JSON)
and reading a job filter or a page size from query or form fields, with a clear error."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from ..readmodel import JobFilter


# ---- formatting (Jinja filters) ------------------------------------------------------------------

def ts(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def dur(value: timedelta | float | None) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        return "in " + dur(-seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def latency(seconds: float | None) -> str:
    """A short wait: milliseconds under a second, else as :func:`dur`."""
    if seconds is None:
        return ""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else dur(seconds)


def ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return ""
    delta = (now or datetime.now(timezone.utc)) - value
    return ("in " + dur(-delta)) if delta.total_seconds() < 0 else dur(delta) + " ago"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def page_size(value: str | None) -> int:
    if not value:
        return 50
    if not value.isdigit() or not 1 <= int(value) <= 500:
        raise ValueError(f"limit must be a whole number from 1 to 500, got {value!r}")
    return int(value)


def when(name: str, value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be a date and time such as 2026-12-01T10:00, got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def filter_from(params: Mapping[str, Any]) -> JobFilter:
    """A JobFilter from query or form fields (empty fields: any); times without a zone are UTC."""
    def text(key: str) -> str | None:
        value = params.get(key)
        return str(value).strip() or None if value is not None else None

    return JobFilter(state=text("state"), queue=text("queue"), task=text("task"), error_class=text("error_class"),
                     since=when("since", text("since")), until=when("until", text("until")), args=text("args"))
