"""Option types the command line shares. :data:`DURATION`: the one duration syntax of every option
that takes a time span (``--delay``, ``--timeout``, ``prune --done``, ``outbox prune --older-than``,
``--poll-interval``, ...): ``30s``, ``5m``, ``1h``, ``1d``, ``2w``, or plain seconds (``90``,
``0.5``). A bad value is a usage error: one line, exit 2."""

from __future__ import annotations

import math
import re
from typing import Any

import click

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d|w)?\s*$")
_UNIT = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_duration(text: str) -> float:
    """``'90'``, ``'0.5'``, ``'90s'``, ``'15m'``, ``'12h'``, ``'7d'``, ``'2w'`` -> seconds. Raises
    ValueError for anything else (negative, NaN, infinite, an unknown unit)."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 1d, or seconds)")
    seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text!r} (too large)")
    return seconds


class Duration(click.ParamType):
    """A duration option's value, in seconds (a float), within ``[min, max]`` if given."""

    name = "duration"

    def __init__(self, min: float | None = None, max: float | None = None):
        self.min, self.max = min, max

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if self.min is not None and seconds < self.min:
            self.fail(f"{value!r} is shorter than {self.min:g} s", param, ctx)
        if self.max is not None and seconds > self.max:
            self.fail(f"{value!r} is longer than {self.max:g} s", param, ctx)
        return seconds

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"

    def __repr__(self) -> str:
        return f"Duration(min={self.min!r}, max={self.max!r})"


DURATION = Duration(min=0)
