"""Is the server there? One short connection attempt, by the DSN's backend (see :mod:`.dsn`), for
:class:`skiplock.reconnect.ReadinessProbe`."""

from __future__ import annotations

from .dsn import is_postgres


def answers(dsn: str) -> bool | None:
    """True: the server accepts connections; False: it is not there (refused, no answer, starting
    or stopping); None: it answered but refused us for another reason (not an outage), or no
    backend can probe this DSN."""
    if is_postgres(dsn):
        from .postgres.probe import answers as postgres_answers

        return postgres_answers(dsn)
    return None
