"""Flow control's configuration: concurrency limits, rates and partitions (docs/flow-control.md).

What is checked here (no I/O): a task's ``concurrency``/``rate``/``partition_by``, a rate's text
(``"100/min"``), a job's ``partition``; a task's ``sequence_by``/``sequence_on_failure``. Sequences
are enforced by the jobs' states (migration 15, 0015_sequences.sql), not by the flow claim. Enforcement is the backend's (``claim_flow``, ``take_starts``
in backend/postgres/queries.sql) and the worker's (worker/flow.py)."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .errors import ConfigurationError

MAX_PARTITION_CHARS = 1000
MAX_SEQUENCE_CHARS = 1000
# What a sequenced job that failed for good (after its last attempt) does to the rest of its sequence
# (docs/flow-control.md, "Sequences"): the first is the default.
SEQUENCE_RULES = ("wait", "skip", "fail")
NOT_SUPPORTED = "is not supported on MySQL/MariaDB yet (flow control needs the PostgreSQL backend)"

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*$")


def parse_rate(text: Any, what: str = "rate") -> tuple[int, float]:
    """``"100/min"`` -> (100, 60.0): at most that many starts per that many seconds. Forms: ``N/s``,
    ``N/min``, ``N/h``, ``N/day`` (also ``second``, ``minute``, ``hour``, plurals) and ``N/10s``.
    Raises ConfigurationError (the message names the form) for anything else."""
    m = _RATE.match(text) if isinstance(text, str) else None
    unit = _UNITS.get(m.group(3)) if m else None
    if m is None or unit is None:
        raise ConfigurationError(f"{what} must look like '100/min' (N per s, min, h or day; or N/10s), got {text!r}")
    count, scale = int(m.group(1)), float(m.group(2) or 1)
    period = scale * unit
    if count < 1 or not math.isfinite(period) or not 0 < period <= 366 * 86400 or count > 1_000_000_000:
        raise ConfigurationError(f"{what} must be at least 1 start per period of at most a year, got {text!r}")
    return count, period


def format_rate(count: int, period: float) -> str:
    """(100, 60.0) -> "100/min"; the inverse of :func:`parse_rate` for the periods it names."""
    for name, seconds in (("day", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if period == seconds:
            return f"{count}/{name}"
    return f"{count}/{period:g}s"


def check_concurrency(value: Any, what: str = "concurrency") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ConfigurationError(f"{what} must be a whole number from 1 to 100000, got {value!r}")
    return value


def check_partition_by(value: Any, what: str = "partition_by") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or "\x00" in value:
        raise ConfigurationError(f"{what} must be the name of a job argument, got {value!r}")
    return value


def check_weights(weights: Any) -> dict[str, int]:
    """A fair queue's ``{partition: weight}`` (whole numbers 1..1000); ConfigurationError otherwise."""
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise ConfigurationError(f"weights must be a mapping of partition to weight, got {type(weights).__name__}")
    out: dict[str, int] = {}
    for partition, weight in weights.items():
        if not isinstance(partition, str) or not 0 < len(partition) <= MAX_PARTITION_CHARS or "\x00" in partition:
            raise ConfigurationError(f"a weight's partition must be a non-empty string, got {partition!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
            raise ConfigurationError(f"the weight of partition {partition!r} must be a whole number from 1 to 1000, "
                                     f"got {weight!r}")
        if weight != 1:
            out[partition] = weight
    return out


def check_sequence_rule(value: Any) -> str:
    """A sequence's failure rule: 'wait' (default), 'skip' or 'fail'; else ConfigurationError."""
    if not isinstance(value, str) or value not in SEQUENCE_RULES:
        raise ConfigurationError(f"sequence_on_failure must be one of {', '.join(SEQUENCE_RULES)}, got {value!r}")
    return value
