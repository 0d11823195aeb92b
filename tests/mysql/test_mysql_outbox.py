"""The MySQL/MariaDB outbox's own guarantees on the private MariaDB (the backend-neutral ones run on both
backends in tests/outbox/test_outbox_backends.py): the claim's plan (its index, no filesort, no full
scan), the rescuer's and the key pruning's indexes, a stale key row pruned, and migration 4 resumable."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import skiplock
from skiplock.backend.mysql import MySQLBackend
from skiplock.backend.mysql.outbox import MySQLOutboxStore


@pytest.fixture
def app(mariadb_dsn: str) -> Iterator[skiplock.App]:
    a = skiplock.App(mariadb_dsn)
    a.migrate()
    yield a
    a.close()


def explain(store: MySQLOutboxStore, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with store.backend._conn() as c, c.cursor() as cur:
        cur.execute(f"ANALYZE TABLE {store.backend.tables['outbox']}")
        cur.fetchall()
        cur.execute("EXPLAIN " + store.q[name], params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


@pytest.mark.parametrize("topics", [None, ["t1"], ["t1", "t2"]])
def test_claim_plan_uses_the_claim_index_without_filesort(app: skiplock.App, topics: Any) -> None:
    """EXPLAIN of the claim: outbox_claim (state, available_at, id) read in order -- no filesort (it
    would lock every candidate row and serialise the relays), no full scan -- and the per-key probe on
    outbox_key, also no scan."""
    app.outbox.put_many([(f"t{i % 3}", {"i": i}, f"k{i % 50}" if i % 2 else None) for i in range(3000)])
    store = app.outbox.store
    assert isinstance(store, MySQLOutboxStore)
    plan = explain(store, "claim", {"all_topics": 0 if topics else 1, "topics": topics or [""], "limit": 100})
    outer = [p for p in plan if p["table"] == "o"]
    probe = [p for p in plan if p["table"] == "p"]
    assert outer and probe, plan
    for p in plan:
        assert "filesort" not in str(p["Extra"]) and "temporary" not in str(p["Extra"]), plan
        assert p["type"] != "ALL", plan
    assert outer[0]["key"] == "outbox_claim" and probe[0]["key"] == "outbox_key", plan


@pytest.mark.parametrize("name, params, index", [
    ("expired_leases", {}, "outbox_lease"),
    ("prune_sent", {"age_us": 0, "batch": 100}, "outbox_finished"),
    ("failed_to_redrive", {"all_ids": 1, "ids": [0], "topic": None}, "outbox_finished"),
    ("stale_keys", {"age_us": 0, "batch": 100}, "outbox_keys_used_at"),
])
def test_the_rescuer_prune_redrive_and_key_pruning_read_their_index(app: skiplock.App, name: str, params: dict[str, Any],
                                                        index: str | None) -> None:
    app.outbox.put_many([("t", {"i": i}, f"k{i}" if i % 2 else None) for i in range(2000)])
    store = app.outbox.store
    assert isinstance(store, MySQLOutboxStore)
    plan = explain(store, name, params)
    assert plan[0]["type"] != "ALL" and "filesort" not in str(plan[0]["Extra"]), str(plan)
    assert plan[0]["key"] == index if index else str(plan[0]["key"]).startswith("outbox_"), plan


def test_prune_forgets_key_rows_unused_for_the_retention_but_never_a_held_one(app: skiplock.App,
                                                                               mariadb_dsn: str) -> None:
    import pymysql

    from skiplock.backend.mysql.dsn import connect_args

    app.outbox.put_many([("t", 1, "old"), ("t", 2, "held")])
    keys = app.outbox.store.backend.tables["outbox_keys"]  # type: ignore[attr-defined]
    holder = pymysql.connect(**connect_args(mariadb_dsn))
    try:
        app.outbox.put("t", 3, key="held", conn=holder)  # its transaction holds the key's row
        assert app.outbox.prune(0) == 0  # no sent message; the unheld key row goes, the held one stays
        with app.outbox.store.backend._conn() as c, c.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"SELECT COUNT(*) FROM {keys}")
            assert cur.fetchone()[0] == 1
        holder.commit()
    finally:
        holder.close()
    assert app.outbox.prune(0) == 0
    with app.outbox.store.backend._conn() as c, c.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(f"SELECT COUNT(*) FROM {keys}")
        assert cur.fetchone()[0] == 0


def test_a_half_applied_outbox_migration_is_reported_then_finished(mariadb_dsn: str) -> None:
    from skiplock.errors import SchemaError

    b = MySQLBackend(mariadb_dsn)
    try:
        b.migrate()
        t = b.tables
        with b._conn() as c, c.cursor() as cur:  # as if cut after the outbox table, before its key table
            cur.execute(f"DELETE FROM {t['schema_version']} WHERE version = 4")
            cur.execute(f"DELETE FROM {t['migration_steps']} WHERE version = 4 AND step <> 'outbox'")
            cur.execute(f"DROP TABLE {t['outbox_keys']}")
        with pytest.raises(SchemaError, match="half-applied migration 4"):
            b.check_schema()
        assert b.migrate() == [4]
        b.check_schema()
        store = b.outbox_store()
        from skiplock.backend.outbox_base import NewMessage

        assert len(store.put([NewMessage("t", "{}", "k", "ik-1", 3)])) == 1  # the key table is back
    finally:
        b.close()


def test_a_handler_puts_a_message_on_job_conn_that_commits_with_its_job(app: skiplock.App) -> None:
    """``app.outbox.put(..., conn=job.conn)`` in a handler: the message commits with the job's done, and
    a failing attempt (rolled back) leaves no message; a wrong connection type is a TypeError."""

    @app.task(name="ship", max_attempts=2, retry=0.0)
    def ship(job: Any, order: int) -> None:
        app.outbox.put("order.shipped", {"order": order, "attempt": job.attempt}, key=f"order-{order}", conn=job.conn)
        if order == 2 and job.attempt == 1:
            raise RuntimeError("first attempt fails after its put")

    ids = [app.enqueue("ship", {"order": n}) for n in (1, 2)]
    app.worker(concurrency=2, poll_interval=0.05).run(stop_when_empty=True)
    assert {app.get_job(i).state for i in ids} == {"done"}
    messages = sorted((m.payload["order"], m.payload["attempt"]) for m in app.outbox.list_messages())
    assert messages == [(1, 1), (2, 2)], "the failed attempt's message survived its rollback"
    with pytest.raises(TypeError, match="PyMySQL connection"):
        app.outbox.put("t", {}, conn=object())


@pytest.mark.parametrize("driver", ["asyncmy", "aiomysql"])
def test_put_async_on_an_asyncio_connection_commits_or_rolls_back_with_the_caller(mariadb_dsn: str,
                                                                                  driver: str) -> None:
    """``await outbox.put_async(..., conn=c)`` on an asyncmy or aiomysql connection runs the put's statement
    steps in the caller's transaction: rolled back, no message; committed, every one; an autocommit
    connection outside a transaction gets one of its own (keyed: lock and insert together)."""
    import asyncio

    from test_mysql_async_conn import close, connect

    async def main(aapp: skiplock.AsyncApp) -> list[Any]:
        conn = await connect(driver, mariadb_dsn, autocommit=False)
        try:
            await aapp.outbox.put_async("order.created", {"order": 1}, key="c7", conn=conn)
            await conn.rollback()
            kept = await aapp.outbox.put_async("order.created", {"order": 2}, key="c7", conn=conn,
                                               idempotency_key="order-2-created")
            more = await aapp.outbox.put_many_async([("order.paid", {"order": 2}, "c7"), ("order.shipped", [2])],
                                                    conn=conn)
            await conn.commit()
            again = await aapp.outbox.put_async("x", {}, conn=conn, idempotency_key="order-2-created")
            await conn.commit()
            assert again == kept
        finally:
            await close(conn)
        auto = await connect(driver, mariadb_dsn, autocommit=True)
        try:
            alone = await aapp.outbox.put_async("t", {"autocommit": True}, key="k", conn=auto)
        finally:
            await close(auto)
        return [kept, *more, alone]

    async def run() -> list[Any]:
        aapp = skiplock.AsyncApp(mariadb_dsn)
        await aapp.migrate()
        try:
            refs = await main(aapp)
            return [(m.topic, m.key, m.payload) for m in [aapp.app.outbox.get(r.id) for r in refs]] + [
                len(aapp.app.outbox.list_messages())]
        finally:
            await aapp.close()

    assert asyncio.run(run()) == [("order.created", "c7", {"order": 2}), ("order.paid", "c7", {"order": 2}),
                                  ("order.shipped", None, [2]), ("t", "k", {"autocommit": True}), 4]
