"""The App's settings, checked where they are given: retention, connect timeout, schema name.

A bad value is a :class:`ConfigurationError` saying what was wrong and where it came from."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any, Mapping

from .errors import ConfigurationError

# How long finished jobs are kept before the pruner deletes them (seconds), by state.
DEFAULT_RETENTION = {"done": 86400.0, "cancelled": 7 * 86400.0, "failed": 30 * 86400.0}
DEFAULT_MAX_ARGS_BYTES = 1 << 20  # 1 MiB of JSON per job
DEFAULT_MAX_RESULT_BYTES = 1 << 20
# How long a call waits for a connection (seconds) unless told otherwise.
DEFAULT_CONNECT_TIMEOUT = 5.0


def _check_retention(retention: Mapping[str, float | timedelta]) -> dict[str, float]:
    """{state: seconds} for finished states; rejects unknown states and negative ages."""
    out: dict[str, float] = {}
    for state, age in retention.items():
        if state not in ("done", "failed", "cancelled"):
            raise ConfigurationError(f"retention is for finished states (done, failed, cancelled), got {state!r}")
        seconds = age.total_seconds() if isinstance(age, timedelta) else age
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError(f"retention for {state!r} must be a non-negative duration, got {age!r}")
        out[state] = float(seconds)
    return out



def _check_connect_timeout(value: Any) -> float:
    """``App(connect_timeout=...)``, else ``SKIPLOCK_CONNECT_TIMEOUT``, else the default; a positive
    finite number of seconds, or ConfigurationError saying where the bad value came from."""
    source = "connect_timeout"
    if value is None:
        env = os.environ.get("SKIPLOCK_CONNECT_TIMEOUT", "").strip()
        if not env:
            return DEFAULT_CONNECT_TIMEOUT
        source = "SKIPLOCK_CONNECT_TIMEOUT"
        try:
            value = float(env)
        except ValueError:
            raise ConfigurationError(f"SKIPLOCK_CONNECT_TIMEOUT must be a number of seconds, got {env!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{source} must be a positive number of seconds, got {value!r}")
    return float(value)


# PostgreSQL keeps the first 63 bytes (NAMEDATALEN - 1) of a name and drops the rest without error.
MAX_NAME_BYTES = 63


def check_schema_name(schema: Any) -> str:
    """Any name PostgreSQL accepts as a schema, as it is (quoted as an identifier wherever it is used:
    quotes, spaces, "%" or non-ASCII letters are fine), or ConfigurationError: not a non-empty
    string, a NUL character, or longer than 63 bytes in UTF-8 -- PostgreSQL would truncate it, and
    two long names sharing their first 63 bytes would silently share tables."""
    if not isinstance(schema, str) or not schema:
        raise ConfigurationError(f"schema must be a non-empty name, got {schema!r}")
    if "\x00" in schema:
        raise ConfigurationError(f"schema names cannot contain NUL characters, got {schema!r}")
    try:
        size = len(schema.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"schema {schema!r} is not valid Unicode (a lone surrogate?)") from None
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(f"schema {schema!r} is {size} bytes in UTF-8; PostgreSQL keeps at most "
                                 f"{MAX_NAME_BYTES} bytes of a name (longer ones would be truncated)")
    return schema

