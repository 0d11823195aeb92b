"""The readiness probe's one attempt for MySQL/MariaDB (see :mod:`skiplock.reconnect`)."""

from __future__ import annotations

import pymysql

from ...errors import ConfigurationError
from .dsn import connect_args

PROBE_CONNECT_TIMEOUT = 2
# Not there: cannot connect (2002 socket, 2003 TCP), gone (2006, 2013), shutting down (1053),
# too many connections for now (1040), server starting (1927 / 2055 lost at handshake).
NOT_THERE = frozenset({1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055})


def answers(dsn: str) -> bool | None:
    """True if the server accepts connections, False if it is not there, None if it answered but
    refused us for another reason (a wrong password, no such database: not an outage), or the DSN
    does not parse."""
    try:
        args = connect_args(dsn)
    except ConfigurationError:
        return None
    args["connect_timeout"] = PROBE_CONNECT_TIMEOUT
    try:
        pymysql.connect(**args).close()
        return True
    except pymysql.err.OperationalError as exc:
        number = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return False if number in NOT_THERE or number is None else None
    except pymysql.err.MySQLError:
        return None
