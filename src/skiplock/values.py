"""What skiplock can store: the checks every text field and every JSON value go through before any
SQL runs, so a refused value never aborts the caller's transaction. Depends on nothing but the
errors, so every layer (app, worker, outbox) can use it without importing the App."""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from .errors import InvalidJob

MAX_TASK_CHARS = 1000
MAX_QUEUE_CHARS = 200
MAX_UNIQUE_KEY_CHARS = 1000


def check_text(name: str, value: Any, limit: int, *, optional: bool = False,
               error: type[Exception] = InvalidJob) -> Any:
    """The one check of every text field skiplock stores (task names, queues, unique keys, outbox
    topics and keys): a non-empty ``str`` of at most ``limit`` characters, without NUL (PostgreSQL
    text cannot hold it) and encodable as UTF-8 (no lone surrogate, e.g. from argv bytes decoded with
    surrogateescape). Else ``error`` naming the field, with the value as a repr (printable whatever it
    holds). None passes when ``optional``. Checked before any SQL, so a refused value never aborts
    the caller's transaction -- whatever the statement (INSERT or COPY)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise error(f"{name} must be a non-empty string of at most {limit} characters, got {value!r}")
    if "\x00" in value:
        raise error(f"{name} must be text without NUL characters (PostgreSQL text cannot hold them), got {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise error(f"{name} must be valid Unicode text, without lone surrogates (UTF-8 cannot encode them; "
                        f"undecodable bytes?), got {value!r}") from None
    return value


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def to_json(value: Any, what: str, limit: int, error: type[Exception] = InvalidJob,
            setting: str = "App(max_args_bytes=...)") -> str:
    """Compact JSON text that PostgreSQL's jsonb accepts, or ``error`` saying exactly why not (NaN or
    Infinity, not serialisable, a lone surrogate, a NUL character, over ``limit`` bytes -- the
    ``setting`` that sets it). Checked before any SQL runs, so a rejected value never aborts the
    caller's transaction. The one definition of a storable JSON value: job args, job results and
    outbox payloads all go through it."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what}: text that is not valid Unicode (a lone surrogate?): {exc.reason}") from None
    except ValueError as exc:
        raise error(f"{what}: not valid JSON: {exc} (NaN and Infinity are not JSON)") from None
    except (TypeError, RecursionError) as exc:
        raise error(f"{what}: not JSON-serialisable: {exc}") from None
    if "\\u0000" in text and _has_nul(value):
        raise error(f"{what}: a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    size = len(text.encode("utf-8"))
    if size > limit:
        raise error(f"{what}: {size:,} bytes as JSON; the limit is {limit:,} ({setting})")
    return text


def _compact_json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)`` without its
    per-call set-up: json.dumps builds a new C encoder on every call, most of its cost for the small
    objects job arguments are. This is that C encoder, built once (checked against json.dumps here;
    json.dumps itself if it is unavailable). It skips the circular-reference check, so a cycle ends in
    RecursionError instead of ValueError: callers treat any error as "use :func:`to_json`", which
    says exactly what is wrong."""
    plain = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is not None:
        try:
            c_encode = make(None, plain.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)

            def encode(value: Any) -> str:
                return "".join(c_encode(value, 0))

            sample = {"a": [1, -2.5, 1e300, None, True, "é\n\"\\\u2028"], "b": {"c": -0.0, "d": 10**20}, "": []}
            if encode(sample) == json.dumps(sample, allow_nan=False, separators=(",", ":"), ensure_ascii=False):
                return encode
        except Exception:  # noqa: BLE001 - another Python's internals: use the public path
            pass
    return plain.encode


_encode_compact = _compact_json_encoder()
