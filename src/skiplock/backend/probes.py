"""Is the server there? One short connection attempt, by the DSN's backend (see :mod:`.dsn`), for
:class:`skiplock.reconnect.ReadinessProbe`."""

from __future__ import annotations

from .dsn import MYSQL_SCHEMES, is_postgres, scheme


def answers(dsn: str) -> bool | None:
    """True: the server accepts connections; False: it is not there (refused, no answer, starting
    or stopping); None: it answered but refused us for another reason (not an outage), or no
    backend can probe this DSN."""
    if is_postgres(dsn):
        from .postgres.probe import answers as postgres_answers

        return postgres_answers(dsn)
    if scheme(dsn) in MYSQL_SCHEMES:
        try:
            from .mysql.probe import answers as mysql_answers
        except ImportError:  # no driver: nothing can probe it
            return None
        return mysql_answers(dsn)
    return None
