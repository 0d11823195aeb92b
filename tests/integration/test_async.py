"""The asyncio API: same core, async handlers, enqueue inside the caller's AsyncConnection transaction."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone

import psycopg
import pytest

import skiplock
from skiplock.backend.postgres.producing import KEYED_ATTEMPTS


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


# ---- the async enqueue on an AsyncConnection decides as the sync one: same errors, same retries ----

HUGE = {"blob": "x" * 300}  # over the max_args_bytes=200 of the apps below
_AWARE = datetime(2030, 1, 1, tzinfo=timezone.utc)
_NAIVE = datetime(2030, 1, 1)


MODES = ("in transaction", "idle", "autocommit")
JOBS_SQL = "SELECT id, task, queue, args, priority, max_attempts, unique_key FROM skiplock.jobs ORDER BY id"


def _sync_and_async(dsn, call, *, setup=None, mode="in transaction", max_args_bytes=200):
    """Run ``call(app_or_aapp, conn)`` through App on a psycopg Connection and through AsyncApp on an
    AsyncConnection, the caller's connection in ``mode`` (a transaction open, none open yet, or
    autocommit); returns both outcomes: ("ok" or ("error", type, message, existing_id), the caller's
    transaction status after the call, the jobs the call added as the caller sees them). After a
    refusal, the caller's connection is usable and holds nothing of the call. Whatever the call
    wrote is removed before the next run."""

    def outcome(exc, returned, before, status, added):
        if exc is None:  # ids of jobs that existed before the call (a key's holder) as they are
            ids = returned if isinstance(returned, list) else [returned]
            return (("ok", [i if i in before else "new" for i in ids]), status.name, added)
        message = str(exc)
        if isinstance(exc, TypeError):  # Python's own signature error names the method called
            message = message.replace("AsyncApp.", "App.")
        return (("error", type(exc), message, getattr(exc, "existing_id", "-")), status.name, added)

    def added(before, rows):
        return [r[1:] for r in rows if r[0] not in before]  # without ids: they differ between the runs

    with psycopg.connect(dsn, autocommit=True) as observer:
        def committed():
            return {r[0] for r in observer.execute(JOBS_SQL)}

        def forget(before):  # what an autocommit run committed
            observer.execute("DELETE FROM skiplock.jobs WHERE NOT (id = ANY(%s))", [list(before)])

        app = skiplock.App(dsn, max_args_bytes=max_args_bytes)
        try:
            if setup:
                setup(app)
            before = committed()
            with psycopg.connect(dsn, autocommit=mode == "autocommit") as conn:
                if mode == "in transaction":
                    conn.execute("SELECT 1")
                returned = None
                try:
                    returned = call(app, conn)
                    exc = None
                except Exception as caught:  # noqa: BLE001 - compared below
                    exc = caught
                status = conn.info.transaction_status
                rows = conn.execute(JOBS_SQL).fetchall()  # the connection is still usable
                sync = outcome(exc, returned, before, status, added(before, rows))
                conn.rollback()
            forget(before)
        finally:
            app.close()

        async def main():
            aapp = skiplock.AsyncApp(dsn, max_args_bytes=max_args_bytes)
            try:
                if setup:
                    await asyncio.to_thread(setup, aapp.app)
                before = committed()
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=mode == "autocommit") as aconn:
                    if mode == "in transaction":
                        await aconn.execute("SELECT 1")
                    returned = None
                    try:
                        returned = await call(aapp, aconn)
                        exc = None
                    except Exception as caught:  # noqa: BLE001 - compared below
                        exc = caught
                    status = aconn.info.transaction_status
                    rows = await (await aconn.execute(JOBS_SQL)).fetchall()
                    await aconn.rollback()
                forget(before)
                return outcome(exc, returned, before, status, added(before, rows))
            finally:
                await aapp.close()

        async_ = asyncio.run(main())
    for result in (sync, async_):
        if result[0][0] != "ok":
            assert result[2] == [], f"a refused enqueue left rows in the caller's transaction: {result}"
    return sync, async_


def _holder(app):
    app.enqueue("t", unique_key="held")  # committed: a queued job holding the key


BAD_ENQUEUE = {
    "unknown option": (lambda a, c: a.enqueue("t", {}, conn=c, bogus=1), None),
    "non-JSON args (NaN)": (lambda a, c: a.enqueue("t", {"x": float("nan")}, conn=c), None),
    "args not serialisable": (lambda a, c: a.enqueue("t", {"x": object()}, conn=c), None),
    "args not a mapping": (lambda a, c: a.enqueue("t", [1, 2], conn=c), None),
    "args with a NUL": (lambda a, c: a.enqueue("t", {"x": "a\x00b"}, conn=c), None),
    "too-large args": (lambda a, c: a.enqueue("t", HUGE, conn=c), None),
    "queue with a NUL": (lambda a, c: a.enqueue("t", {}, queue="q\x00; drop table jobs", conn=c), None),
    "queue with a lone surrogate": (lambda a, c: a.enqueue("t", {}, queue="q\udcff", conn=c), None),
    "queue too long": (lambda a, c: a.enqueue("t", {}, queue="q" * 201, conn=c), None),
    "task empty": (lambda a, c: a.enqueue("", {}, conn=c), None),
    "task not text": (lambda a, c: a.enqueue(42, {}, conn=c), None),
    "priority a bool": (lambda a, c: a.enqueue("t", {}, priority=True, conn=c), None),
    "max_attempts zero": (lambda a, c: a.enqueue("t", {}, max_attempts=0, conn=c), None),
    "run_at and delay": (lambda a, c: a.enqueue("t", {}, delay=1, run_at=_AWARE, conn=c), None),
    "naive run_at": (lambda a, c: a.enqueue("t", {}, run_at=_NAIVE, conn=c), None),
    "bad on_conflict": (lambda a, c: a.enqueue("t", {}, on_conflict="ignore", conn=c), None),
    "unique key with a NUL": (lambda a, c: a.enqueue("t", {}, unique_key="k\x00", conn=c), None),
    "unique conflict, raise": (lambda a, c: a.enqueue("t", {}, unique_key="held", on_conflict="raise", conn=c),
                               _holder),
    "unique conflict, return": (lambda a, c: a.enqueue("t", {}, unique_key="held", conn=c), _holder),
    "unknown task (accepted)": (lambda a, c: a.enqueue("nobody.registers.this", {"a": 1}, queue="q", conn=c), None),
    "many: a bad item": (lambda a, c: a.enqueue_many([("t", {}), ("t", {"x": float("inf")})], conn=c), None),
    "many: too-large item": (lambda a, c: a.enqueue_many([("t", {}), ("t", HUGE)], conn=c), None),
    "many: hostile queue": (lambda a, c: a.enqueue_many([("t", {}, {"queue": "\x00"})], conn=c), None),
    "many: unknown item option": (lambda a, c: a.enqueue_many([("t", {}, {"bogus": 1})], conn=c), None),
    "many: not an item": (lambda a, c: a.enqueue_many(["t"], conn=c), None),
    "many: same key twice, raise": (lambda a, c: a.enqueue_many(
        [("t", {}, {"unique_key": "k"}), ("t", {}, {"unique_key": "k", "on_conflict": "raise"})], conn=c), None),
    "many: key held, raise": (lambda a, c: a.enqueue_many(
        [("t", {}), ("t", {}, {"unique_key": "held", "on_conflict": "raise"})], conn=c), _holder),
    "many: key held, return": (lambda a, c: a.enqueue_many(
        [("t", {}, {"unique_key": "held"}), ("t", {"i": 1})], conn=c), _holder),
}


@pytest.mark.parametrize("case,mode", [(case, mode) for case in sorted(BAD_ENQUEUE) for mode in MODES
                                       if mode == MODES[0] or "key" in case or "unique" in case])
def test_async_enqueue_on_async_connection_raises_what_the_sync_enqueue_raises(dsn, case, mode):
    call, setup = BAD_ENQUEUE[case]
    sync, async_ = _sync_and_async(dsn, call, setup=setup, mode=mode)
    assert async_ == sync
    if case.endswith("(accepted)") or case.endswith("return"):
        assert sync[0][0] == "ok"
        assert ("new" in sync[0][1]) == bool(sync[2])  # what it created is what the caller sees
    else:
        assert sync[0][0] == "error"
        assert issubclass(sync[0][1], (skiplock.InvalidJob, skiplock.DuplicateJob, TypeError))


CONTESTED = """
CREATE SEQUENCE tries;
CREATE FUNCTION skip_contested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('tries'); RETURN NULL; END $$;
CREATE TRIGGER skip_contested BEFORE INSERT ON skiplock.jobs FOR EACH ROW
  WHEN (NEW.unique_key = 'contested') EXECUTE FUNCTION skip_contested();
"""


@pytest.mark.parametrize("call", [
    lambda a, c: a.enqueue("t", {}, unique_key="contested", conn=c),
    lambda a, c: a.enqueue_many([("t", {}), ("t", {}, {"unique_key": "contested"})], conn=c),
], ids=["enqueue", "enqueue_many"])
def test_async_enqueue_gives_up_on_a_contested_key_after_the_same_attempts_as_sync(dsn, db, call):
    """A key whose holder is never there to be read (a trigger skips the insert: each attempt finds a
    conflict-free insert that inserted nothing and no holder) -- the case of a holder that finishes
    between our conflict and our lookup, every time. Both paths try the same number of times, then
    raise the same DatabaseUnavailable; the caller's transaction stays usable."""
    db.execute(CONTESTED)
    fired = 0
    for mode in MODES:
        sync, async_ = _sync_and_async(dsn, call, mode=mode)
        assert sync[0][:2] == ("error", skiplock.DatabaseUnavailable) and "kept changing hands" in sync[0][2]
        assert async_ == sync
        tries = db.execute("SELECT last_value FROM tries").fetchone()[0]
        assert tries - fired == 2 * KEYED_ATTEMPTS, f"{mode}: each path makes KEYED_ATTEMPTS attempts"
        fired = tries


def test_async_enqueue_on_async_connection_with_the_apps_server_down_raises_database_unavailable(dsn, tmp_path):
    """The app's own database is unreachable (its pool checks the schema first) while the caller's
    connection works: both paths raise the same DatabaseUnavailable, nothing written."""
    dead = f"host={tmp_path} port=1 dbname=nothing connect_timeout=2"

    async def run_async():
        aapp = skiplock.AsyncApp(dead, connect_timeout=1)
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            try:
                await aapp.enqueue("t", {}, conn=aconn)
            except skiplock.DatabaseUnavailable as exc:
                return str(exc)
        raise AssertionError("expected DatabaseUnavailable")

    app = skiplock.App(dead, connect_timeout=1)
    with psycopg.connect(dsn) as conn:
        try:
            app.enqueue("t", {}, conn=conn)
        except skiplock.DatabaseUnavailable as exc:
            sync = str(exc)
        else:
            raise AssertionError("expected DatabaseUnavailable")
    assert asyncio.run(run_async()) == sync


def test_sync_enqueue_on_an_async_connection_is_refused_clearly(dsn, app):
    """App.enqueue / enqueue_many given an AsyncConnection: a TypeError pointing at the asyncio API
    (not a coroutine that is never awaited), nothing sent."""

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            for call in (lambda: app.enqueue("t", {}, conn=aconn),
                         lambda: app.enqueue("t", {}, unique_key="k", conn=aconn),
                         lambda: app.enqueue_many([("t", {})] * 3, conn=aconn),
                         lambda: app.enqueue_many([("t", {})] * 1000, conn=aconn),
                         lambda: app.enqueue_many([("t", {}, {"unique_key": "k"})], conn=aconn)):
                with pytest.raises(TypeError, match=r"AsyncConnection needs the asyncio API: `await skiplock.AsyncApp"):
                    call()
            assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # nothing was sent

    asyncio.run(main())
    assert app.counts() == []
