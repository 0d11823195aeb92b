"""Writing: a message exists only if the caller's transaction commits; bad input is refused before any SQL;
idempotency keys are stable and unique; per-key writers serialise so id order is commit order."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg.rows import dict_row

from skiplock.outbox import InvalidMessage, MessageNotFound


def count(db, where: str = "TRUE") -> int:
    return db.execute(f"SELECT count(*) FROM skiplock.outbox WHERE {where}").fetchone()[0]


def test_put_in_committed_transaction_is_stored_with_an_idempotency_key(app, dsn, db):
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        ref = app.outbox.put("order.created", {"order": 1}, conn=conn)
        assert count(db) == 0, "visible before the business transaction committed"
        conn.commit()
    assert count(db) == 1
    msg = app.outbox.get(ref.id)
    assert (msg.topic, msg.payload, msg.state, msg.attempts, msg.key) == ("order.created", {"order": 1}, "pending", 0, None)
    assert msg.idempotency_key == ref.idempotency_key and len(ref.idempotency_key) >= 32


def test_rolled_back_transaction_publishes_nothing(app, dsn, db):
    with psycopg.connect(dsn) as conn:
        app.outbox.put("order.created", {"order": 1}, conn=conn)
        app.outbox.put_many([("order.created", {"order": 2}), ("order.paid", {"order": 2}, "k")], conn=conn)
        conn.rollback()
    assert count(db) == 0


def test_put_without_conn_commits_at_once_and_autocommit_conn_works(app, dsn, db):
    app.outbox.put("t", [1, 2, 3])
    with psycopg.connect(dsn, autocommit=True) as conn:
        app.outbox.put("t", "text", key="k", conn=conn)  # keyed: lock + insert in one transaction of its own
        with conn.transaction():
            app.outbox.put("t", None, conn=conn)
    assert count(db) == 3


def test_put_on_a_dict_row_connection(app, dsn, db):
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        ref = app.outbox.put("t", {"a": 1}, key="k", conn=conn)
        conn.commit()
    assert isinstance(ref.id, int)


def test_given_idempotency_key_is_kept_and_a_repeat_put_stores_once(app, db):
    first = app.outbox.put("t", {"n": 1}, idempotency_key="order-1-created")
    again = app.outbox.put("t", {"n": 1}, idempotency_key="order-1-created")
    assert first == again and first.idempotency_key == "order-1-created"
    refs = app.outbox.put_many([{"topic": "t", "payload": 1, "idempotency_key": "x"},
                                {"topic": "t", "payload": 2, "idempotency_key": "order-1-created"},
                                {"topic": "t", "payload": 3, "idempotency_key": "x"}])
    assert refs[1] == first and refs[0] == refs[2]
    assert count(db) == 2


def test_generated_idempotency_keys_are_unique(app, db):
    refs = app.outbox.put_many([("t", {"i": i}) for i in range(500)])
    assert len({r.idempotency_key for r in refs}) == 500
    assert [r.id for r in refs] == sorted(r.id for r in refs)


@pytest.mark.parametrize("call, message", [
    (lambda o: o.put("", {}), "topic must be a non-empty string"),
    (lambda o: o.put(None, {}), "topic must be a non-empty string"),
    (lambda o: o.put("t\x00", {}), "NUL"),
    (lambda o: o.put("t", {1, 2}), "not JSON-serialisable"),
    (lambda o: o.put("t", {"x": float("nan")}), "NaN"),
    (lambda o: o.put("t", {"x": "a\x00b"}), "NUL"),
    (lambda o: o.put("t", "\ud800"), "not valid Unicode"),
    (lambda o: o.put("t", {}, key=""), "key must be a non-empty string"),
    (lambda o: o.put("t", {}, idempotency_key="has space"), "visible ASCII"),
    (lambda o: o.put("t", {}, max_attempts=0), "max_attempts"),
    (lambda o: o.put("t", "x" * (2 << 20)), "the limit is"),
    (lambda o: o.put_many([("t",)]), "message 0: expected"),
    (lambda o: o.put_many([{"topic": "t"}]), "message 0: needs 'topic' and 'payload'"),
])
def test_bad_input_is_refused_before_any_sql(app, dsn, db, call, message):
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(InvalidMessage, match=message):
            call_with_conn(app, call, conn)
        conn.execute("SELECT 1")  # the caller's transaction is still usable
        conn.commit()
    assert count(db) == 0


def call_with_conn(app, call, conn):
    class Bound:
        def put(self, *a, **k):
            return app.outbox.put(*a, conn=conn, **k)

        def put_many(self, *a, **k):
            return app.outbox.put_many(*a, conn=conn, **k)
    return call(Bound())


def test_get_unknown_id_and_redrive_errors(app):
    with pytest.raises(MessageNotFound, match="no outbox message with id 999"):
        app.outbox.get(999)
    ref = app.outbox.put("t", {})
    with pytest.raises(MessageNotFound, match="999"):
        app.outbox.redrive([ref.id, 999])
    with pytest.raises(InvalidMessage, match=f"{ref.id} is pending"):
        app.outbox.redrive([ref.id])
    with pytest.raises(InvalidMessage, match="unknown state"):
        app.outbox.list_messages(state="sideways")


def test_writers_of_one_key_serialise_so_id_order_is_commit_order(app, dsn, db):
    """T1 puts key k and stays open; T2's put of k waits for T1 (it cannot take an id before T1
    ends), so T2's message has the larger id and commits later. Another key does not wait."""
    with psycopg.connect(dsn) as t1, psycopg.connect(dsn) as t2, psycopg.connect(dsn) as t3:
        first = app.outbox.put("t", {"n": 1}, key="k", conn=t1)
        result: dict[str, object] = {}

        def second() -> None:
            result["ref"] = app.outbox.put("t", {"n": 2}, key="k", conn=t2)
            t2.commit()

        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 10
        while count_waiting(db) == 0:  # T2 is blocked on the key's lock
            assert time.monotonic() < deadline, "the second writer of key k never waited"
            time.sleep(0.01)
        other = app.outbox.put("t", {"n": 3}, key="other", conn=t3)  # a different key does not wait
        t3.commit()
        assert "ref" not in result
        t1.commit()
        thread.join(10)
        assert result["ref"].id > first.id and other.id < result["ref"].id


def count_waiting(db) -> int:
    return db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0]


def test_prune_deletes_old_sent_messages_only(app, db):
    a, b, c = app.outbox.put_many([("t", 1), ("t", 2), ("t", 3)])
    db.execute("UPDATE skiplock.outbox SET state = 'sent', finished_at = now() - interval '2 hours' WHERE id = %s", [a.id])
    db.execute("UPDATE skiplock.outbox SET state = 'failed', finished_at = now() - interval '2 hours' WHERE id = %s", [b.id])
    assert app.outbox.prune(3600) == 1
    assert sorted(m.id for m in app.outbox.list_messages()) == [b.id, c.id]


# ---- asyncio: put on the caller's AsyncConnection ------------------------------------------------

def test_put_async_on_an_async_connection_commits_or_rolls_back_with_the_caller(app, dsn, db):
    async def main() -> list:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            kept = await app.outbox.put_async("order.created", {"order": 1}, key="customer-7", conn=conn,
                                              idempotency_key="order-1-created")
            more = await app.outbox.put_many_async([("order.paid", {"order": 1}, "customer-7"),
                                                    {"topic": "order.shipped", "payload": [1, 2]}], conn=conn)
            assert count(db) == 0, "visible before the caller's transaction committed"
            await conn.commit()
            await app.outbox.put_async("order.created", {"order": 2}, conn=conn)
            await conn.rollback()  # never published
            # A second put of a stored idempotency key stores nothing and returns the stored message.
            again = await app.outbox.put_async("order.created", {"order": 1}, conn=conn, idempotency_key="order-1-created")
            await conn.commit()
            assert again == kept
            with pytest.raises(InvalidMessage):
                await app.outbox.put_async("", {}, conn=conn)
            assert await app.outbox.put_many_async([], conn=conn) == []
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as auto:
            alone = await app.outbox.put_async("t", {"autocommit": True}, key="k", conn=auto)  # its own transaction
        without = await app.outbox.put_async("t", {"no": "conn"})  # skiplock's own connection, in a thread
        return [kept, *more, alone, without]

    refs = asyncio.run(main())
    assert [(m.topic, m.key, m.payload) for m in (app.outbox.get(r.id) for r in refs)] == [
        ("order.created", "customer-7", {"order": 1}), ("order.paid", "customer-7", {"order": 1}),
        ("order.shipped", None, [1, 2]), ("t", "k", {"autocommit": True}), ("t", None, {"no": "conn"})]
    assert count(db) == 5
    assert refs[0].idempotency_key == "order-1-created"


def test_the_sync_put_refuses_an_async_connection(app, dsn):
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(TypeError, match="put_async"):
                app.outbox.put("t", {}, conn=conn)

    asyncio.run(main())
