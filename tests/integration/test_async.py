"""The asyncio API: same core, async handlers, enqueue inside the caller's AsyncConnection transaction."""

from __future__ import annotations

import asyncio
import re

import psycopg

import skiplock


def test_async_app_end_to_end(dsn, db):
    async def main() -> None:
        aapp = skiplock.AsyncApp(dsn)

        @aapp.task(name="add")
        async def add(job, a, b):
            await asyncio.sleep(0.01)
            job.conn.execute("INSERT INTO sums VALUES (%s)", [a + b])
            return a + b

        db.execute("CREATE TABLE sums (n int)")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await aapp.enqueue("add", {"a": 1, "b": 1}, conn=conn)
            await conn.rollback()  # rolled back: no job
            kept = await aapp.enqueue("add", {"a": 2, "b": 3}, conn=conn)
            many = await aapp.enqueue_many([("add", {"a": 1, "b": 2}), ("add", {"a": 5, "b": 5})], conn=conn)
            await conn.commit()
        assert (await aapp.get_job(kept)).state == "queued"
        plain = await aapp.enqueue("add", {"a": 10, "b": 10})
        stats = await aapp.run_worker(concurrency=2, stop_when_empty=True)
        assert stats.done == 4
        assert await aapp.wait(kept, timeout=5) == 5
        assert [(await aapp.get_job(i)).result for i in many + [plain]] == [3, 10, 20]
        assert sorted(r[0] for r in db.execute("SELECT n FROM sums")) == [3, 5, 10, 20]
        await aapp.close()

    asyncio.run(main())


def test_async_unique_key_on_async_connection(dsn):
    async def main() -> None:
        aapp = skiplock.AsyncApp(dsn)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            a = await aapp.enqueue("t", unique_key="u", conn=conn)
            b = await aapp.enqueue("t", unique_key="u", conn=conn)
            await conn.commit()
        assert a == b
        try:
            await aapp.enqueue("t", unique_key="u", on_conflict="raise")
        except skiplock.DuplicateJob as exc:
            assert exc.existing_id == a
        else:
            raise AssertionError("expected DuplicateJob")
        await aapp.close()

    asyncio.run(main())


def test_async_enqueue_many_on_async_connection_checks_items_like_the_sync_api(dsn, db):
    async def main() -> None:
        aapp = skiplock.AsyncApp(dsn)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for bad, message in [(("t", {"x": float("nan")}), "item 1: args: not valid JSON"),
                                 (("t", {}, {"bogus": 1}), r"item 1: unknown options \['bogus'\]")]:
                try:
                    await aapp.enqueue_many([("t", {}), bad], conn=conn)
                except skiplock.InvalidJob as exc:
                    assert re.match(message, str(exc)), exc
                else:
                    raise AssertionError("expected InvalidJob")
            ids = await aapp.enqueue_many([("t", {"i": i}) for i in range(1500)], conn=conn)  # any size
            await conn.commit()
        assert [(await aapp.get_job(i)).args for i in ids[::500]] == [{"i": 0}, {"i": 500}, {"i": 1000}]
        await aapp.close()

    asyncio.run(main())
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 1500
