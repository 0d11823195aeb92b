"""Receiver-side deduplication: apply a redelivered message's effect once, by recording its idempotency key
in the same transaction as the effect.

The outbox relay delivers at least once: a relay that crashes after the receiver applied a message but
before it recorded ``sent`` delivers it again. The receiver makes that harmless::

    from skiplock import dedup

    dedup.install(conn)                      # once: creates the table skiplock_dedup
    ...
    with conn.transaction():                 # the receiver's own transaction
        if dedup.once(conn, request.headers["Idempotency-Key"], scope="orders"):
            conn.execute("INSERT INTO shipments ...")   # the effect, only the first time
    # reply 2xx either way: a duplicate is a success that was already applied

Why it is exact: ``once`` inserts the key with ``ON CONFLICT DO NOTHING`` in the caller's transaction.
If that transaction commits, the key and the effect are stored together; if it rolls back, neither is,
and the next delivery applies the effect. Two deliveries of one key racing each other serialise on the
key's unique index: the second waits for the first to commit and then sees the key (returns False),
or, if the first rolled back, takes over (returns True). It needs PostgreSQL (psycopg 3) on the
receiver's side, any database or schema: it has nothing to do with skiplock's own tables.

Keys are kept until :func:`forget` removes old ones; keep them longer than any message can be
redelivered (the relay's max attempts times its largest backoff, plus the time a message may wait).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from psycopg import sql
from psycopg.pq import TransactionStatus

from .errors import SkiplockError
from .backend.postgres.queries import identifier_text

DEFAULT_TABLE = "skiplock_dedup"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 1000

_CREATE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {table} ("
    " scope text NOT NULL, key text NOT NULL, seen_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (scope, key))")
_CREATE_INDEX = sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {table} (seen_at)")
# The whole trick: the insert either claims the key for this transaction or finds it taken.
_ONCE = sql.SQL("INSERT INTO {table} (scope, key) VALUES (%(scope)s, %(key)s) ON CONFLICT DO NOTHING RETURNING 1")
_SEEN = sql.SQL("SELECT 1 FROM {table} WHERE scope = %(scope)s AND key = %(key)s")
_FORGET = sql.SQL("DELETE FROM {table} WHERE seen_at < now() - %(age)s::float8 * interval '1 second'")


class DedupError(SkiplockError, ValueError):
    """The helper was used in a way that cannot deduplicate (no transaction, empty key)."""


def _table(table: str, schema: str | None) -> sql.Composable:
    if not isinstance(table, str) or not table:
        raise DedupError(f"table must be a non-empty name, got {table!r}")
    # Text without "%" (a "%" in a quoted name would be read as a placeholder by the parameterised
    # statements): see backend.postgres.queries.identifier_text.
    return sql.SQL(identifier_text(schema, table) if schema else identifier_text(table))


def _check(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS or "\x00" in value:
        raise DedupError(f"{name} must be a non-empty string of at most {MAX_KEY_CHARS} characters without NUL, "
                         f"got {value!r}")
    return value


def install(conn: Any, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
    """Create the dedup table (and its age index) if it does not exist. Idempotent."""
    target = _table(table, schema)
    conn.execute(_CREATE.format(table=target))
    conn.execute(_CREATE_INDEX.format(index=sql.SQL(identifier_text(f"{table}_seen_at_idx")), table=target))


def once(conn: Any, key: str, *, scope: str = "default", table: str = DEFAULT_TABLE, schema: str | None = None) -> bool:
    """True the first time ``key`` (within ``scope``) is recorded: apply the effect now, in this same
    transaction. False if it was already recorded by a committed transaction: skip the effect.

    Must run inside the transaction that applies the effect (a non-autocommit connection, or inside
    ``conn.transaction()``); on an autocommit connection outside a transaction the key would commit
    alone and a crash before the effect would lose it, so that raises :class:`DedupError`.
    ``scope`` separates independent consumers of the same messages (each applies its effect once).
    """
    _check("key", key)
    _check("scope", scope)
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise DedupError("dedup.once must run inside the transaction that applies the effect "
                         "(use `with conn.transaction():` on an autocommit connection)")
    cur = conn.cursor()
    cur.execute(_ONCE.format(table=_table(table, schema)), {"scope": scope, "key": key})
    return cur.fetchone() is not None


def seen(conn: Any, key: str, *, scope: str = "default", table: str = DEFAULT_TABLE, schema: str | None = None) -> bool:
    """Whether ``key`` has been recorded (read only; to decide, use :func:`once`)."""
    cur = conn.cursor()
    cur.execute(_SEEN.format(table=_table(table, schema)), {"scope": _check("scope", scope), "key": _check("key", key)})
    return cur.fetchone() is not None


def forget(conn: Any, older_than: float, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> int:
    """Delete keys recorded more than ``older_than`` seconds ago; returns how many."""
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or not math.isfinite(older_than) \
            or older_than < 0:
        raise DedupError(f"older_than must be a non-negative number of seconds, got {older_than!r}")
    cur = conn.cursor()
    cur.execute(_FORGET.format(table=_table(table, schema)), {"age": float(older_than)})
    return cur.rowcount


def idempotency_key(headers: Mapping[str, str]) -> str | None:
    """The ``Idempotency-Key`` header the HTTP sink sends (case-insensitive lookup), or None."""
    for name, value in headers.items():
        if name.lower() == IDEMPOTENCY_HEADER.lower():
            return value
    return None
