"""AsyncApp on the caller's own asyncio MySQL connection (issue 12): ``await aapp.enqueue(..., conn=c)``
and ``await aapp.enqueue_many(..., conn=c)`` with an asyncmy connection (the ``mysql`` extra's driver)
or an aiomysql one, on the private MariaDB. They run inside the caller's transaction -- rolled back,
no job; committed, every job -- driven by the very statement steps of the sync path
(backend/mysql/steps.py), so unique keys and ``on_conflict="raise"`` behave as on a PyMySQL
connection. And the one sync-path fix those steps brought: a keyed ``enqueue_many`` on a PyMySQL
connection in autocommit mode inside the caller's explicit ``BEGIN`` no longer commits it."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pymysql
import pytest

import skiplock
from skiplock.backend.mysql.dsn import connect_args
from skiplock.errors import ConfigurationError, DuplicateJob

DRIVERS = ["asyncmy", "aiomysql"]


async def connect(driver: str, dsn: str, *, autocommit: bool) -> Any:
    args = connect_args(dsn)
    if driver == "asyncmy":
        import asyncmy

        return await asyncmy.connect(host=args["host"], port=args["port"], user=args["user"],
                                     password=args["password"], database=args["database"], autocommit=autocommit,
                                     charset="utf8mb4")
    import aiomysql

    return await aiomysql.connect(host=args["host"], port=args["port"], user=args["user"], password=args["password"],
                                  db=args["database"], autocommit=autocommit, charset="utf8mb4")


def scenario(dsn: str, body: Callable[[skiplock.AsyncApp], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        aapp = skiplock.AsyncApp(dsn)
        aapp.task(name="t")(lambda job, **kw: None)
        await aapp.migrate()
        try:
            return await body(aapp)
        finally:
            await aapp.close()
    return asyncio.run(main())


async def close(conn: Any) -> None:
    closed = conn.close()
    if asyncio.iscoroutine(closed):
        await closed


async def jobs(aapp: skiplock.AsyncApp) -> list[tuple[int, str, dict[str, Any]]]:
    return [(j.id, j.task, j.args) for j in reversed(await aapp.list_jobs(limit=1000))]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-transaction"])
def test_enqueue_on_the_callers_async_connection_commits_with_it_or_not_at_all(
        mariadb_dsn: str, driver: str, autocommit: bool) -> None:
    async def body(aapp: skiplock.AsyncApp) -> None:
        conn = await connect(driver, mariadb_dsn, autocommit=autocommit)
        try:
            await conn.begin()
            gone = await aapp.enqueue("t", {"n": 1}, conn=conn)
            gone_many = await aapp.enqueue_many([("t", {"n": 2}), ("t", {"n": 3}, {"priority": 5})], conn=conn)
            assert await jobs(aapp) == []  # not visible outside the caller's transaction
            await conn.rollback()
            assert await jobs(aapp) == []

            await conn.begin()
            one = await aapp.enqueue("t", {"text": "é ✓ 日本"}, conn=conn, priority=3)
            many = await aapp.enqueue_many([("t", {"n": i}) for i in range(5)], conn=conn)
            await conn.commit()
        finally:
            await close(conn)
        assert gone < one and gone_many[0] < one  # the rolled-back ids were drawn, then undone
        assert many == list(range(many[0], many[0] + 5))  # ascending in input order
        assert await jobs(aapp) == [(one, "t", {"text": "é ✓ 日本"}), *[(m, "t", {"n": i}) for i, m in enumerate(many)]]
        assert (await aapp.get_job(one)).priority == 3
    scenario(mariadb_dsn, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_unique_keys_and_on_conflict_raise_in_the_callers_async_transaction(mariadb_dsn: str, driver: str) -> None:
    async def body(aapp: skiplock.AsyncApp) -> None:
        held = await aapp.enqueue("t", {"n": 0}, unique_key="held")  # committed (no conn)
        conn = await connect(driver, mariadb_dsn, autocommit=False)
        try:
            await conn.begin()
            mine = await aapp.enqueue("t", {"n": 1}, unique_key="mine", conn=conn)
            assert await aapp.enqueue("t", {"n": 2}, unique_key="mine", conn=conn) == mine
            assert await aapp.enqueue("t", {"n": 3}, unique_key="held", conn=conn) == held
            with pytest.raises(DuplicateJob) as raised:
                await aapp.enqueue("t", {"n": 4}, unique_key="held", on_conflict="raise", conn=conn)
            assert raised.value.existing_id == held
            ids = await aapp.enqueue_many([("t", {"n": 5}, {"unique_key": "held"}), ("t", {"n": 6}),
                                           ("t", {"n": 7}, {"unique_key": "new"}),
                                           ("t", {"n": 8}, {"unique_key": "new"})], conn=conn)
            assert ids[0] == held and ids[2] == ids[3] and len(set(ids)) == 3
            # a refused keyed batch leaves nothing of itself, and the caller's transaction as it was
            with pytest.raises(DuplicateJob) as raised:
                await aapp.enqueue_many([("t", {"n": 9}), ("t", {"n": 10}, {"unique_key": "held", "on_conflict": "raise"})],
                                        conn=conn)
            assert raised.value.existing_id == held
            await conn.commit()
        finally:
            await close(conn)
        found = await jobs(aapp)
        assert sorted(j[2]["n"] for j in found) == [0, 1, 6, 7]  # keyed items go in first (docs/mysql.md)
        assert {j[0] for j in found} == {held, mine, ids[1], ids[2]}
    scenario(mariadb_dsn, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_keyed_batch_on_an_autocommit_async_connection_is_one_transaction_of_its_own(
        mariadb_dsn: str, driver: str) -> None:
    async def body(aapp: skiplock.AsyncApp) -> None:
        held = await aapp.enqueue("t", {"n": 0}, unique_key="held")
        conn = await connect(driver, mariadb_dsn, autocommit=True)
        try:
            with pytest.raises(DuplicateJob):
                await aapp.enqueue_many([("t", {"n": 1}, {"unique_key": "a"}),
                                         ("t", {"n": 2}, {"unique_key": "held", "on_conflict": "raise"})], conn=conn)
            assert [j[0] for j in await jobs(aapp)] == [held]  # all of the call or none
            ids = await aapp.enqueue_many([("t", {"n": 3}, {"unique_key": "a"}), ("t", {"n": 4})], conn=conn)
        finally:
            await close(conn)
        assert [j[0] for j in await jobs(aapp)] == [held, *sorted(ids)]  # committed on its own
    scenario(mariadb_dsn, body)


def test_a_server_error_on_the_async_connection_is_skiplocks_and_says_no_password(mariadb_dsn: str) -> None:
    async def body(aapp: skiplock.AsyncApp) -> None:
        conn = await connect("asyncmy", mariadb_dsn, autocommit=False)
        try:
            await conn.begin()
            async with conn.cursor() as cur:
                await cur.execute("DROP TABLE skiplock_jobs")  # DDL: an implicit commit, then the table is gone
            with pytest.raises(skiplock.errors.DatabaseError) as raised:
                await aapp.enqueue("t", {}, conn=conn)
        finally:
            await close(conn)
        password = connect_args(mariadb_dsn)["password"]
        assert raised.value.sqlstate == "1146" and password not in str(raised.value) + repr(raised.value)
        assert raised.value.__cause__ is None and raised.value.__context__ is None
    scenario(mariadb_dsn, body)


def test_keyed_enqueue_many_inside_an_explicit_begin_on_an_autocommit_pymysql_connection_rolls_back(
        mariadb_dsn: str) -> None:
    """Before the steps asked the connection whether a transaction is open, an autocommit connection
    got a BEGIN of its own even inside the caller's BEGIN -- an implicit COMMIT of the caller's work --
    and a COMMIT after: the caller's rollback then undid nothing."""
    app = skiplock.App(mariadb_dsn)
    app.task(name="t")(lambda job, **kw: None)
    app.migrate()
    conn = pymysql.connect(**connect_args(mariadb_dsn), autocommit=True, charset="utf8mb4")
    try:
        conn.begin()
        app.enqueue_many([("t", {"n": 1}, {"unique_key": "a"}), ("t", {"n": 2})], conn=conn)
        conn.rollback()
        assert app.list_jobs() == []
    finally:
        conn.close()
        app.close()


def test_the_asyncio_worker_refuses_a_mariadb_dsn_with_one_clear_error(mariadb_dsn: str) -> None:
    async def body(aapp: skiplock.AsyncApp) -> None:
        with pytest.raises(ConfigurationError) as raised:
            await aapp.run_async_worker(stop_when_empty=True)
        assert "asyncio worker" in str(raised.value) and "run_worker" in str(raised.value)
    scenario(mariadb_dsn, body)
