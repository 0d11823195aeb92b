"""Exceptions skiplock raises; each says what went wrong and what to do about it."""

from __future__ import annotations

import re
from urllib.parse import quote


class SkiplockError(Exception):
    """Base class of every error skiplock raises on purpose."""


class ConfigurationError(SkiplockError):
    """The DSN, data directory or another setting cannot be used."""


class DatabaseUnavailable(SkiplockError):
    """The database cannot be reached (wrong DSN, server down, network)."""


class ConnectionLost(DatabaseUnavailable):
    """The database session ended under an operation (a server restart, a terminate, a network cut, a
    server-side timeout). Any transaction it had open was rolled back by the server: a job leased by
    it is available again. Raised by the backend in place of the driver's own errors."""


class DatabaseError(SkiplockError):
    """The server refused a statement on a live session (a constraint, a deadlock, a cancelled
    statement, a deferred constraint at COMMIT). The session is usable after a rollback.
    ``sqlstate`` is the server's error code when it gave one."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class SchemaError(SkiplockError):
    """The database has no skiplock schema, or one of a version this code does not know."""


class InvalidJob(SkiplockError, ValueError):
    """A job cannot be enqueued as given (arguments not JSON, too large, bad option). Nothing was written."""


class UnknownTask(SkiplockError, KeyError):
    """No task of that name is registered with the app."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown task"


class JobNotFound(SkiplockError, LookupError):
    """No job has that id."""


class DuplicateJob(SkiplockError):
    """A queued or running job already holds this unique key (raised only with ``on_conflict="raise"``).
    ``existing_id`` is that job's id; None when the holder is an earlier item of the same
    ``enqueue_many`` call (it was not inserted either)."""

    def __init__(self, message: str, existing_id: int | None):
        super().__init__(message)
        self.existing_id = existing_id


class UnknownQueue(SkiplockError, LookupError):
    """No job has ever used that queue (pass ``force=True`` to pause it anyway)."""


class JobFailed(SkiplockError):
    """The job a caller waited on ended ``failed`` (or ``cancelled``); ``.job`` has its errors."""

    def __init__(self, message: str, job: object):
        super().__init__(message)
        self.job = job


class WaitTimeout(SkiplockError, TimeoutError):
    """The job did not finish within the time given to ``wait``."""


# ---- secrets on display ---------------------------------------------------------------------------
# A DSN's password (or sslpassword) is never shown: every message, log line or repr that names a
# database goes through redact_dsn (the DSN itself) or redact (any other text that may quote it).

REDACTED = "***"
MIN_SEARCHED_SECRET = 4
# postgresql://user:PASSWORD@host -- the password runs to the last "@" of the URI token
_URI_USERINFO = re.compile(r"(?P<keep>\b[a-z][a-z0-9+.-]*://[^\s:@/\"']*:)[^\s\"']*@", re.I)
# ?password=PASSWORD or &password=PASSWORD in a URI's query
_URI_PARAM = re.compile(r"(?P<keep>[?&](?:ssl)?password=)[^&#\s\"']*", re.I)
# password=PASSWORD or password = 'PASS WORD' in key=value form (a quote may be left unterminated)
_KV = re.compile(r"(?P<keep>(?<![?&\w])(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*(?:'|$)|[^\s'\"]+)", re.I)
# Every pattern above needs one of these (``://``, or ``password`` in any case): a text without either
# has nothing to mask, found by one search instead of three substitutions (a log line per job).
_MAYBE_SECRET = re.compile(r"://|password", re.I)


def _mask(text: str) -> str:
    if not _MAYBE_SECRET.search(text):
        return text
    text = _URI_USERINFO.sub(lambda m: f"{m.group('keep')}{REDACTED}@", text)
    text = _URI_PARAM.sub(lambda m: f"{m.group('keep')}{REDACTED}", text)
    return _KV.sub(lambda m: f"{m.group('keep')}{REDACTED}", text)


def _secrets(dsn: str | None) -> list[str]:
    """The password values a DSN carries (as its backend parses it, and as they may be spelled in a URI)."""
    if not dsn:
        return []
    from .backend.dsn import secrets

    # Shorter values are not searched for in free text (every "a" of a message is not a password);
    # DSN-shaped text is masked whatever the password's length (see _mask).
    values = [value for value in secrets(dsn) if len(value) >= MIN_SEARCHED_SECRET]
    return [v for value in values for v in {value, quote(value, safe=""), quote(value)}]


def redact(text: str, dsn: str | None = None) -> str:
    """``text`` (an error message, a log line) with every password removed: those of DSNs it quotes
    (URI or key=value form) and, wherever they appear, the password of ``dsn`` (if at least
    MIN_SEARCHED_SECRET characters long)."""
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _mask(text)


def redact_dsn(dsn: str) -> str:
    """The DSN for display: its settings without password or sslpassword (a PostgreSQL DSN in
    key=value form, parsed by libpq's rules; another scheme's URI without its password); an
    unparseable DSN is shown as given, its passwords masked."""
    from .backend.dsn import without_secrets

    shown = without_secrets(dsn)
    if shown is None:
        return f"unparseable DSN {redact(dsn)!r}"
    return redact(shown, dsn) or "<defaults>"


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL text can store it: a NUL becomes the four characters ``\\x00`` and a
    lone surrogate its ``\\udXXX`` escape; anything else is unchanged. Applied to every error text
    before it is written, so recording an outcome can never fail on what a handler said."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
