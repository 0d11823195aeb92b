"""enqueue_many with unique keys per item: one queued or running job per key -- against existing jobs,
within the call and between concurrent calls; on_conflict='raise' enqueues nothing and leaves the
caller's transaction usable; bad keys are refused before anything is sent."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg.rows import dict_row

import skiplock
from skiplock import DuplicateJob, InvalidJob
from skiplock.backend.postgres.producing import COPY_MIN_JOBS

from test_enqueue_many import recording_cursor


def _count(db) -> int:
    return db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0]


def _set_state(db, job_id: int, state: str) -> None:
    if state == "running":  # as a claimed-lease worker leaves it
        db.execute("UPDATE skiplock.jobs SET state = 'running', owner = gen_random_uuid(), "
                   "lease_expires_at = now() + interval '1 hour' WHERE id = %s", [job_id])
    else:
        db.execute("UPDATE skiplock.jobs SET state = %s, finished_at = now() WHERE id = %s", [state, job_id])


def _wait_until_blocked(db, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"session {pid} never waited on a lock")



def _enqueue_behind(app, db, first, second, items) -> list[int]:
    """``enqueue_many(items)`` on ``second``, in a thread, until it blocks behind the keys ``first``
    holds uncommitted; then ``first`` commits. Returns the ids (``second`` committed)."""
    result: dict[str, list[int]] = {}

    def enqueue() -> None:
        result["ids"] = app.enqueue_many(items, conn=second)
        second.commit()

    thread = threading.Thread(target=enqueue)
    thread.start()
    _wait_until_blocked(db, second.info.backend_pid)
    first.commit()
    thread.join(30)
    return result["ids"]


def test_keys_held_by_queued_or_running_jobs_give_the_holders_ids(app, db):
    queued = app.enqueue("t", unique_key="q")
    running = app.enqueue("t", unique_key="r")
    _set_state(db, running, "running")
    ids = app.enqueue_many([("t", {"i": 0}, {"unique_key": "q"}), ("t", {"i": 1}),
                            ("t", {"i": 2}, {"unique_key": "r", "priority": 5}), ("t", {"i": 3}, {"unique_key": "new"}),
                            ("t", {"i": 4})])
    assert ids[0] == queued and ids[2] == running
    created = [ids[1], ids[3], ids[4]]
    assert created == sorted(created) and created[0] > running  # the new jobs: ascending in input order
    rows = db.execute("SELECT id, (args->>'i')::int, unique_key, state FROM skiplock.jobs ORDER BY id").fetchall()
    assert rows == [(queued, None, "q", "queued"), (running, None, "r", "running"),
                    (ids[1], 1, None, "queued"), (ids[3], 3, "new", "queued"), (ids[4], 4, None, "queued")]


def test_items_of_one_call_sharing_a_key_get_the_first_ones_job(app, db):
    ids = app.enqueue_many([("t", {"n": 1}, {"unique_key": "k"}), ("t", {"n": 2}, {"unique_key": "k"}), ("t", {"n": 3}),
                            ("t", {"n": 4}, {"unique_key": "k", "queue": "elsewhere"})])
    assert ids[0] == ids[1] == ids[3] and ids[2] > ids[0]
    assert db.execute("SELECT args, queue FROM skiplock.jobs WHERE unique_key = 'k'").fetchall() == [({"n": 1}, "default")]
    assert _count(db) == 2


@pytest.mark.parametrize("state", ["done", "failed", "cancelled"])
def test_a_finished_job_frees_its_key(app, db, state):
    old = app.enqueue("t", unique_key="k")
    _set_state(db, old, state)
    ids = app.enqueue_many([("t", {}, {"unique_key": "k", "on_conflict": "raise"})])
    assert ids[0] > old
    job = app.get_job(ids[0])
    assert (job.unique_key, job.state) == ("k", "queued")
    assert app.enqueue_many([("t", {}, {"unique_key": "k"})]) == ids  # and the new job holds it


KINDS = ["pool", "open transaction", "no transaction yet", "autocommit", "pipeline", "dict_row"]


@pytest.mark.parametrize("kind", KINDS)
def test_raise_enqueues_nothing_and_leaves_the_callers_transaction_usable(app, dsn, db, kind):
    db.execute("CREATE TABLE mine (x int)")
    holder = app.enqueue("t", unique_key="taken")
    items = [("t", {"i": 0}, {"unique_key": "fresh"}), ("t", {"i": 1}),
             ("t", {"i": 2}, {"unique_key": "taken", "on_conflict": "raise"}), ("t", {"i": 3}, {"unique_key": "other"})]
    db.execute("LISTEN skiplock")
    if kind == "pool":
        with pytest.raises(DuplicateJob, match="item 2: job .* already holds unique_key 'taken'") as info:
            app.enqueue_many(items)
    else:
        options = {"autocommit": True} if kind == "autocommit" else {"row_factory": dict_row} if kind == "dict_row" else {}
        with psycopg.connect(dsn, **options) as conn:
            if kind in ("open transaction", "pipeline", "dict_row"):
                conn.execute("INSERT INTO mine VALUES (1)")
            with pytest.raises(DuplicateJob, match="item 2: job .* already holds unique_key 'taken'") as info:
                if kind == "pipeline":
                    with conn.pipeline():
                        app.enqueue_many(items, conn=conn)
                else:
                    app.enqueue_many(items, conn=conn)
            if kind == "no transaction yet":
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # as it was
            conn.execute("INSERT INTO mine VALUES (2)")  # the transaction is usable
            assert app.enqueue_many([("t", {}, {"unique_key": "fresh"})], conn=conn)[0] > holder  # "fresh" is free
            conn.commit()
    assert info.value.existing_id == holder
    rows = db.execute("SELECT unique_key FROM skiplock.jobs ORDER BY id").fetchall()
    assert rows == ([("taken",)] if kind == "pool" else [("taken",), ("fresh",)])
    if kind != "pool":
        expected = [(1,), (2,)] if kind in ("open transaction", "pipeline", "dict_row") else [(2,)]
        assert db.execute("SELECT x FROM mine ORDER BY x").fetchall() == expected
        assert [n.payload for n in db.notifies(timeout=1.0, stop_after=1)] == ["enqueued:skiplock"]  # the 2nd call's
    assert list(db.notifies(timeout=0.2)) == []  # the refused call's wake-up was undone with it


def test_a_duplicate_within_the_call_with_raise_is_refused_before_anything_is_sent(app, dsn, db):
    cursor = recording_cursor()
    with psycopg.connect(dsn, cursor_factory=cursor) as conn:
        with pytest.raises(DuplicateJob, match="item 2: unique_key 'k' is also item 0's") as info:
            app.enqueue_many([("t", {}, {"unique_key": "k"}), ("t", {}),
                              ("t", {}, {"unique_key": "k", "on_conflict": "raise"})], conn=conn)
        assert cursor.sent == [] and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert info.value.existing_id is None and _count(db) == 0


@pytest.mark.parametrize("options, message", [
    ({"unique_key": ""}, "unique_key must be a non-empty string"),
    ({"unique_key": 7}, "unique_key must be a non-empty string"),
    ({"unique_key": "a\x00b"}, "without NUL"),
    ({"unique_key": "k" * 1001}, "at most 1000 characters"),
    ({"unique_key": "k", "on_conflict": "update"}, "on_conflict must be 'return' or 'raise'"),
    ({"unique_key": "k", "unique": True}, r"unknown options \['unique'\]"),
])
def test_bad_keys_are_refused_naming_the_item_before_anything_is_sent(app, dsn, db, options, message):
    cursor = recording_cursor()
    with psycopg.connect(dsn, cursor_factory=cursor) as conn:
        conn.execute("CREATE TABLE mine (x int)")
        with pytest.raises(InvalidJob, match=f"^item 2: .*{message}"):
            app.enqueue_many([("t", {}, {"unique_key": "good"}), ("t", {}), ("t", {}, options)], conn=conn)
        assert cursor.sent == ["execute"]  # the CREATE TABLE only
        conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is not aborted
        conn.commit()
    assert _count(db) == 0 and db.execute("SELECT count(*) FROM mine").fetchone()[0] == 1


def test_a_large_mixed_batch_is_one_insert_not_copy(app, dsn, db):
    held = app.enqueue("t", {"held": True}, unique_key="k7")
    items = [("t", {"i": i}, {"unique_key": f"k{i % 50}"}) if i % 3 == 0 else ("t", {"i": i})
             for i in range(COPY_MIN_JOBS + 200)]
    cursor = recording_cursor()
    with psycopg.connect(dsn, cursor_factory=cursor) as conn:
        ids = app.enqueue_many(items, conn=conn)
        conn.commit()
    assert cursor.sent == ["execute"]  # one statement: every holder was in its snapshot
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if len(item) == 3:
            first.setdefault(item[2]["unique_key"], i)
    created = [i for i, item in enumerate(items)
               if len(item) == 2 or (item[2]["unique_key"] != "k7" and first[item[2]["unique_key"]] == i)]
    assert len(created) == 800 + 49
    new = [ids[i] for i in created]
    assert new == sorted(set(new)) and new[0] > held  # ascending in input order
    for i, item in enumerate(items):
        if len(item) == 3:
            key = item[2]["unique_key"]
            assert ids[i] == (held if key == "k7" else ids[first[key]])
    rows = db.execute("SELECT id, (args->>'i')::int FROM skiplock.jobs WHERE id <> %s ORDER BY id", [held]).fetchall()
    assert rows == [(ids[i], i) for i in created]


def test_a_holder_committed_while_the_insert_waited_is_read_in_a_second_statement(app, dsn, db):
    keys = [("t", {"i": i}, {"unique_key": f"k{i}"}) for i in range(5)]
    cursor = recording_cursor()
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, cursor_factory=cursor) as second:
        held = app.enqueue_many(keys, conn=first)  # not committed yet
        ids = _enqueue_behind(app, db, first, second, [("t", {})] + keys[::-1])
    assert ids[1:] == held[::-1]
    assert cursor.sent == ["execute", "execute"]  # the insert, then the lookup of holders it could not see
    assert _count(db) == 6


def test_a_holder_that_finishes_before_it_is_read_makes_the_attempt_run_again(app, dsn, db):
    """The insert waits for a concurrent holder to commit, which its snapshot then cannot see; the
    holder finishes before the lookup: the attempt is undone (savepoint) and run again, creating the
    job -- ids still ascending, nothing of the first attempt left."""
    lookup = app.backend.q["unique_key_holders"]

    class FinishHolderBeforeLookup(psycopg.Cursor):
        fired = False

        def execute(self, query, *args, **kwargs):  # type: ignore[override]
            if query == lookup and not type(self).fired:
                type(self).fired = True
                db.execute("UPDATE skiplock.jobs SET state = 'done', finished_at = now() WHERE unique_key = 'k'")
            return super().execute(query, *args, **kwargs)

    db.execute("CREATE TABLE mine (x int)")
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, cursor_factory=FinishHolderBeforeLookup) as second:
        holder = app.enqueue_many([("t", {}, {"unique_key": "k"})], conn=first)[0]  # not committed yet
        second.execute("INSERT INTO mine VALUES (1)")  # an open transaction: attempts are savepoints
        ids = _enqueue_behind(app, db, first, second,
                              [("t", {"i": 0}), ("t", {"i": 1}, {"unique_key": "k"}), ("t", {"i": 2})])
    assert FinishHolderBeforeLookup.fired
    assert ids == sorted(ids) and ids[0] > holder
    assert db.execute("SELECT id, unique_key, state FROM skiplock.jobs ORDER BY id").fetchall() == [
        (holder, "k", "done"), (ids[0], None, "queued"), (ids[1], "k", "queued"), (ids[2], None, "queued")]
    assert db.execute("SELECT x FROM mine").fetchall() == [(1,)]


def test_concurrent_batches_of_the_same_keys_create_one_job_per_key(dsn, db):
    """Two threads enqueue_many the same keys at once -- in opposite orders, which would deadlock if
    rows went in input order -- many times: exactly one job per key, and both see its id."""
    apps = [skiplock.App(dsn) for _ in range(2)]
    try:
        for round_ in range(5):
            keys = [f"r{round_}:{k}" for k in range(300)]
            barrier = threading.Barrier(2)
            results: list[dict[str, int]] = [{}, {}]
            errors: list[BaseException] = []

            def enqueue(n: int) -> None:
                ordered = keys if n == 0 else keys[::-1]
                try:
                    barrier.wait()
                    ids = apps[n].enqueue_many([("t", {"n": n}, {"unique_key": k}) for k in ordered])
                    results[n] = dict(zip(ordered, ids))
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert errors == []
            assert results[0] == results[1]
            rows = db.execute("SELECT unique_key, id FROM skiplock.jobs WHERE unique_key LIKE %s",
                              [f"r{round_}:%"]).fetchall()
            assert dict(rows) == results[0] and len(rows) == len(keys)
    finally:
        for a in apps:
            a.close()


def test_async_enqueue_many_with_keys_on_an_async_connection(dsn, db):
    async def main() -> None:
        aapp = skiplock.AsyncApp(dsn)
        holder = await aapp.enqueue("t", unique_key="taken")
        db.execute("CREATE TABLE mine (x int)")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("INSERT INTO mine VALUES (1)")
            ids = await aapp.enqueue_many([("t", {}, {"unique_key": "taken"}), ("t", {}, {"unique_key": "new"}),
                                           ("t", {}, {"unique_key": "new"}), ("t", {})], conn=conn)
            assert ids[0] == holder and ids[1] == ids[2] and holder < ids[1] < ids[3]
            try:
                await aapp.enqueue_many([("t", {}, {"unique_key": "more"}),
                                         ("t", {}, {"unique_key": "taken", "on_conflict": "raise"})], conn=conn)
            except DuplicateJob as exc:
                assert exc.existing_id == holder and "item 1" in str(exc)
            else:
                raise AssertionError("expected DuplicateJob")
            await conn.execute("INSERT INTO mine VALUES (2)")  # still usable
            await conn.commit()
        assert await aapp.enqueue_many([("t", {}, {"unique_key": "new"})]) == [ids[1]]  # threaded path
        await aapp.close()

    asyncio.run(main())
    assert db.execute("SELECT unique_key FROM skiplock.jobs ORDER BY id").fetchall() == [("taken",), ("new",), (None,)]
    assert db.execute("SELECT x FROM mine ORDER BY x").fetchall() == [(1,), (2,)]


def test_async_enqueue_checks_keys_before_sending_on_any_async_connection(dsn, db):
    async def main() -> None:
        aapp = skiplock.AsyncApp(dsn)
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
            await conn.execute("CREATE TABLE mine (x int)")
            for bad in [{"unique_key": "a\x00b"}, {"unique_key": ""}, {"unique_key": "k", "on_conflict": "skip"}]:
                try:
                    await aapp.enqueue("t", conn=conn, **bad)
                except InvalidJob:
                    pass
                else:
                    raise AssertionError(f"expected InvalidJob for {bad}")
            await conn.execute("INSERT INTO mine VALUES (1)")  # the transaction is not aborted
            one = await aapp.enqueue("t", conn=conn)
            keyed = await aapp.enqueue("t", unique_key="k", conn=conn)
            assert await aapp.enqueue("t", unique_key="k", conn=conn) == keyed
            ids = await aapp.enqueue_many([("t", {}), ("t", {}, {"unique_key": "k"})], conn=conn)
            assert ids[0] > keyed and ids[1] == keyed
            await conn.commit()
        assert isinstance(one, int)
        await aapp.close()

    asyncio.run(main())
    assert _count(db) == 3 and db.execute("SELECT count(*) FROM mine").fetchone()[0] == 1
