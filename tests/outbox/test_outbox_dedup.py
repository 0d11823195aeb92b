"""skiplock.dedup on a real PostgreSQL: the key commits with the effect or not at all; concurrent deliveries
of one key serialise; misuse (no transaction) is refused."""

from __future__ import annotations

import threading

import psycopg
import pytest
from outbox_support import wait_for

from skiplock import dedup


@pytest.fixture
def rdb(receiver_dsn):
    with psycopg.connect(receiver_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS skiplock_dedup, seen_messages, dedup_effects")
        dedup.install(c)
        dedup.install(c)  # idempotent
        c.execute("CREATE TABLE dedup_effects (key text)")
        yield c


def apply(conn, key: str, scope: str = "s") -> bool:
    with conn.transaction():
        first = dedup.once(conn, key, scope=scope)
        if first:
            conn.execute("INSERT INTO dedup_effects VALUES (%s)", [key])
        return first


def effects(rdb) -> int:
    return rdb.execute("SELECT count(*) FROM dedup_effects").fetchone()[0]


def test_once_applies_the_effect_the_first_time_only(rdb):
    assert apply(rdb, "k1") is True
    assert apply(rdb, "k1") is False
    assert apply(rdb, "k1", scope="other-consumer") is True
    assert effects(rdb) == 2
    assert dedup.seen(rdb, "k1", scope="s") and not dedup.seen(rdb, "k2", scope="s")


def test_a_rolled_back_effect_leaves_the_key_free(rdb, receiver_dsn):
    with psycopg.connect(receiver_dsn) as conn:
        assert dedup.once(conn, "k") is True
        conn.execute("INSERT INTO dedup_effects VALUES ('k')")
        conn.rollback()  # the receiver crashed before committing
    assert effects(rdb) == 0
    assert apply(rdb, "k", scope="default") is True


def test_concurrent_deliveries_of_one_key_apply_once(rdb, receiver_dsn):
    with psycopg.connect(receiver_dsn) as first, psycopg.connect(receiver_dsn) as second:
        assert dedup.once(first, "k") is True
        result = {}

        def racing() -> None:
            result["second"] = dedup.once(second, "k")  # waits on the first's uncommitted key
            second.commit()

        t = threading.Thread(target=racing)
        t.start()
        wait_for(lambda: rdb.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0], 10,
                 "the second delivery to wait on the first's key")
        assert "second" not in result
        first.commit()
        t.join(10)
        assert result["second"] is False


def test_misuse_is_refused(rdb):
    with pytest.raises(dedup.DedupError, match="inside the transaction"):
        dedup.once(rdb, "k")  # autocommit, no transaction: the key would commit without the effect
    with pytest.raises(dedup.DedupError, match="key must be"):
        with rdb.transaction():
            dedup.once(rdb, "")
    with pytest.raises(dedup.DedupError, match="older_than"):
        dedup.forget(rdb, -1)


def test_forget_old_keys_and_custom_table(rdb):
    dedup.install(rdb, table="seen_messages")
    with rdb.transaction():
        assert dedup.once(rdb, "k", table="seen_messages")
    rdb.execute("UPDATE seen_messages SET seen_at = now() - interval '2 days'")
    assert dedup.forget(rdb, 86400, table="seen_messages") == 1
    assert dedup.idempotency_key({"idempotency-key": "abc"}) == "abc"


@pytest.mark.parametrize("schema, table", [("dedup%schema", "seen%keys"), ("d\\e%d", 'q"uo%ted')])
def test_any_schema_and_table_name_works(rdb, schema, table):
    rdb.execute(psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(schema)))
    rdb.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
    dedup.install(rdb, schema=schema, table=table)
    with rdb.transaction():
        assert dedup.once(rdb, "k", schema=schema, table=table)
    with rdb.transaction():
        assert not dedup.once(rdb, "k", schema=schema, table=table)
    assert dedup.seen(rdb, "k", schema=schema, table=table)
    assert dedup.forget(rdb, 0, schema=schema, table=table) == 1
    tables = rdb.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = %s",
                         [schema, table]).fetchone()[0]
    assert tables == 1  # the very names given, not another table
