"""The asyncio API: same core, async handlers, enqueue inside the caller's AsyncConnection transaction."""

from __future__ import annotations

import asyncio

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
