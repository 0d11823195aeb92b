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
from typing import Any, Sequence

from ..errors import redact

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What ``skiplock --log-format`` chose (the group sets it before a command runs).
default_format = "text"


def _redact(text: str) -> str:
    try:
        return redact(text)
    except Exception:  # noqa: BLE001 - logging never raises
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = self._entry(record)
        entry["message"] = _redact(record.getMessage())
        if record.exc_info:
            entry["exception"] = _redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = _redact(record.exc_text)
        return json.dumps(entry, ensure_ascii=False, default=str)

    def format_messages(self, record: logging.LogRecord, messages: Sequence[str]) -> list[str]:
        """What ``format`` gives for ``record`` with each of ``messages`` (no arguments, no
        exception) as its message: the time and the rest of the entry made once."""
        entry = self._entry(record)
        lines = []
        for message in messages:
            entry["message"] = _redact(message)
            lines.append(json.dumps(entry, ensure_ascii=False, default=str))
        return lines

    @staticmethod
    def _entry(record: logging.LogRecord) -> dict[str, Any]:
        return {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": "",
            "thread": record.threadName,
        }


class RedactingFormatter(logging.Formatter):
    """The text format, with DSN passwords redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return _redact(super().format(record))

    def format_messages(self, record: logging.LogRecord, messages: Sequence[str]) -> list[str]:
        """What ``format`` gives for ``record`` with each of ``messages`` (no arguments, no
        exception) as its message: the time formatted once."""
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        lines = []
        for message in messages:
            record.message = message
            lines.append(_redact(self.formatMessage(record)))
        return lines


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """``configure_logging``'s handler: a ``StreamHandler`` (a line per record, flushed) that can also
    write many records of one logger, level and moment -- a worker's line per finished job, for a
    batch -- in one write (:func:`log_lines`), the same lines ``emit`` would have written one by one."""

    def emit_messages(self, record: logging.LogRecord, messages: Sequence[str]) -> None:
        formatter = self.formatter
        if not isinstance(formatter, (RedactingFormatter, JsonFormatter)):  # another formatter set since
            for message in messages:
                record.msg = message
                self.handle(record)
            return
        try:
            text = "".join(line + self.terminator for line in formatter.format_messages(record, messages))
            self.acquire()
            try:
                self.stream.write(text)
                self.flush()
            finally:
                self.release()
        except Exception:  # noqa: BLE001 - logging never raises (the handler's own policy)
            self.handleError(record)


def _sole_line_handler(logger: logging.Logger, level: int) -> LineHandler | None:
    """The one handler a record of ``logger`` at ``level`` reaches, if it is a :class:`LineHandler`
    without filters and no logger on the way has filters (else None: the usual path)."""
    found: LineHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters or current.disabled:
            return None
        for handler in current.handlers:
            if level >= handler.level:
                if found is not None or type(handler) is not LineHandler or handler.filters:
                    return None
                found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def log_lines(logger: logging.Logger, level: int, messages: Sequence[str], func: str) -> None:
    """``logger.log(level, message)`` for each of ``messages`` (already rendered, with no arguments),
    logged at one moment by one function ``func`` of the caller: the same records, handlers and
    filters as one call each, with no walk up the stack for the caller's line; when the only handler
    is ``configure_logging``'s, formatted with one time and written in one write (a worker's line per
    finished job costs a fifth as much: docs/benchmarks.md)."""
    if not messages or not logger.isEnabledFor(level):
        return
    handler = _sole_line_handler(logger, level)
    if handler is not None:
        handler.emit_messages(logger.makeRecord(logger.name, level, __file__, 0, messages[0], (), None, func),
                              messages)
        return
    for message in messages:
        logger.handle(logger.makeRecord(logger.name, level, __file__, 0, message, (), None, func))


def configure_logging(level: str | int = "INFO", fmt: str | None = None, stream: Any = None) -> logging.Handler:
    """Send every log record at ``level`` and above to ``stream`` (stderr), as text or ``json``
    (default: what ``--log-format`` chose). Replaces the root logger's handlers. Returns the handler."""
    fmt = default_format if fmt is None else fmt
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = LineHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else RedactingFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler
