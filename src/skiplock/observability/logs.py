"""Log output for people and for log shippers: :func:`configure_logging` (what ``skiplock worker``
and ``skiplock relay`` call; ``--log-format json`` on the ``skiplock`` group picks JSON) and
:class:`JsonFormatter` (one JSON object per line) for use in your own logging set-up:

    import logging, sys
    from skiplock.observability.logs import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level="INFO", handlers=[handler])

Each JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, ``thread`` and, for a
record logged with an exception, ``exception`` (its traceback). Every message is run through
``skiplock.errors.redact`` (a DSN's password never reaches a line, in either format).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What ``skiplock --log-format`` chose (the group sets it before a command runs).
default_format = "text"


def _redact(text: str) -> str:
    from ..errors import redact

    try:
        return redact(text)
    except Exception:  # noqa: BLE001 - logging never raises
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": _redact(record.getMessage()),
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = _redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = _redact(record.exc_text)
        return json.dumps(entry, ensure_ascii=False, default=str)


class RedactingFormatter(logging.Formatter):
    """The text format, with DSN passwords redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return _redact(super().format(record))


def configure_logging(level: str | int = "INFO", fmt: str | None = None, stream: Any = None) -> logging.Handler:
    """Send every log record at ``level`` and above to ``stream`` (stderr), as text or ``json``
    (default: what ``--log-format`` chose). Replaces the root logger's handlers. Returns the handler."""
    fmt = default_format if fmt is None else fmt
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else RedactingFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler
