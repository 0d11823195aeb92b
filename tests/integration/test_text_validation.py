"""All text input is validated the same way, on every enqueue path: a lone surrogate (text that
cannot be encoded as UTF-8) in a task name, queue, unique key, args or outbox message raises the
input error before any SQL, and the caller's transaction stays usable."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from skiplock import AsyncApp, InvalidJob
from skiplock.backend.postgres.producing import COPY_MIN_JOBS
from skiplock.outbox.errors import InvalidMessage

from support import run_cli

# As Python decodes the bytes b"\xed\xa0\x80" (an encoded surrogate, invalid UTF-8) in argv.
ESCAPED = b"\xed\xa0\x80".decode("utf-8", "surrogateescape")

# case -> (task, args, options, the field the error must name)
BAD = {
    "task": ("t\ud800", {}, {}, "task"),
    "task_escaped": (f"t{ESCAPED}", {}, {}, "task"),
    "queue": ("t", {}, {"queue": "q\udcff"}, "queue"),
    "unique_key": ("t", {}, {"unique_key": f"k{ESCAPED}"}, "unique_key"),
    "args_value": ("t", {"a": "\ud800"}, {}, "args"),
    "args_key": ("t", {"\udfff": 1}, {}, "args"),
}


def check_refusal(exc: BaseException, field: str) -> None:
    message = str(exc)
    assert field in message and "surrogate" in message, message
    message.encode("utf-8")  # printable as it is (a repr, not the raw text)


def jobs(db) -> list[tuple[str, dict]]:
    return db.execute("SELECT task, args FROM skiplock.jobs ORDER BY id").fetchall()


def single(app, conn, task, args, options):
    return app.enqueue(task, args, conn=conn, **options)


def many_insert(app, conn, task, args, options):
    return app.enqueue_many([("t", {"i": 1}), ("t", {"i": 2}), (task, args, options)], conn=conn)


def many_copy(app, conn, task, args, options):
    good = [("t", {"i": i}) for i in range(COPY_MIN_JOBS)]  # large enough for COPY (unique keys: INSERT)
    return app.enqueue_many(good + [(task, args, options)], conn=conn)


@pytest.mark.parametrize("path", [single, many_insert, many_copy])
@pytest.mark.parametrize("case", list(BAD))
def test_sync_paths_refuse_bad_text_and_keep_the_callers_transaction(app, dsn, db, path, case):
    task, args, options, field = BAD[case]
    with psycopg.connect(dsn) as conn:
        app.enqueue("t", {"before": True}, conn=conn)
        with pytest.raises(InvalidJob) as caught:
            path(app, conn, task, args, options)
        check_refusal(caught.value, field)
        if path is not single:
            assert "item " in str(caught.value)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        app.enqueue("t", {"after": True}, conn=conn)
        conn.commit()
    assert jobs(db) == [("t", {"before": True}), ("t", {"after": True})]


def test_sync_paths_refuse_bad_text_without_a_connection(app, db):
    for case, (task, args, options, field) in BAD.items():
        for call in (lambda: app.enqueue(task, args, **options), lambda: app.enqueue_many([(task, args, options)])):
            with pytest.raises(InvalidJob) as caught:
                call()
            check_refusal(caught.value, field)
    assert jobs(db) == []


@pytest.mark.parametrize("case", list(BAD))
def test_async_paths_refuse_bad_text_and_keep_the_callers_transaction(app, dsn, db, case):
    task, args, options, field = BAD[case]
    aapp = AsyncApp(app=app)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await aapp.enqueue("t", {"before": True}, conn=conn)
            with pytest.raises(InvalidJob) as caught:
                await aapp.enqueue(task, args, conn=conn, **options)
            check_refusal(caught.value, field)
            with pytest.raises(InvalidJob) as caught:
                await aapp.enqueue_many([("t", {}), (task, args, options)], conn=conn)
            check_refusal(caught.value, field)
            await conn.execute("SELECT 1")
            await aapp.enqueue("t", {"after": True}, conn=conn)
            await conn.commit()
        with pytest.raises(InvalidJob) as caught:  # no connection: the sync core in a thread
            await aapp.enqueue(task, args, **options)
        check_refusal(caught.value, field)

    asyncio.run(main())
    assert jobs(db) == [("t", {"before": True}), ("t", {"after": True})]


OUTBOX_BAD = {
    "topic": (dict(topic="orders\ud800", payload={}), "topic"),
    "topic_escaped": (dict(topic=f"orders{ESCAPED}", payload={}), "topic"),
    "key": (dict(topic="orders", payload={}, key="k\udcff"), "key"),
    "payload": (dict(topic="orders", payload={"a": ["\ud800"]}), "payload"),
    "payload_string": (dict(topic="orders", payload="\udfff"), "payload"),
}


@pytest.mark.parametrize("case", list(OUTBOX_BAD))
def test_outbox_put_refuses_bad_text_and_keeps_the_callers_transaction(app, dsn, db, case):
    kwargs, field = OUTBOX_BAD[case]
    with psycopg.connect(dsn) as conn:
        app.outbox.put("orders", {"n": 1}, conn=conn)
        with pytest.raises(InvalidMessage) as caught:
            app.outbox.put(conn=conn, **kwargs)
        check_refusal(caught.value, field)
        with pytest.raises(InvalidMessage) as caught:
            app.outbox.put_many([kwargs], conn=conn)
        check_refusal(caught.value, field)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        app.outbox.put("orders", {"n": 2}, conn=conn)
        conn.commit()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(InvalidMessage) as caught:
                await app.outbox.put_async(conn=conn, **kwargs)
            check_refusal(caught.value, field)
            await conn.execute("SELECT 1")

    asyncio.run(main())
    rows = db.execute("SELECT topic, payload FROM skiplock.outbox ORDER BY id").fetchall()
    assert rows == [("orders", {"n": 1}), ("orders", {"n": 2})]


@pytest.mark.parametrize("args, field", [
    ([ESCAPED], "task"),
    (["t", "--queue", f"q{ESCAPED}"], "queue"),
    (["t", "--unique-key", ESCAPED], "unique_key"),
])
def test_cli_enqueue_refuses_bad_text_with_one_line_and_exit_2(dsn, db, tmp_path, args, field):
    result = run_cli(dsn, "enqueue", *args, cwd=tmp_path)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and field in lines[0] and "surrogate" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert jobs(db) == []


def test_a_task_name_that_cannot_be_stored_is_refused_at_registration(app):
    for name in ("t\ud800", f"t{ESCAPED}", "t\x00"):
        with pytest.raises(InvalidJob, match="task name"):
            app.task(name=name)(lambda job: None)
    assert app.tasks == {}


@pytest.mark.parametrize("bad", ["q\x00", "q\ud800", f"q{ESCAPED}"])
def test_reads_filters_cancel_reasons_and_worker_queues_refuse_bad_text_too(app, db, bad):
    job_id = app.enqueue("t")
    for call in (lambda: app.list_jobs(queue=bad), lambda: app.list_jobs(task=bad),
                 lambda: app.cancel_job(job_id, reason=bad)):
        with pytest.raises(InvalidJob) as caught:
            call()
        assert "NUL" in str(caught.value) or "surrogate" in str(caught.value), caught.value
    with pytest.raises(ValueError, match="queue"):
        app.worker(queues=[bad])  # a worker that could never claim anything, reconnecting for ever
    assert app.get_job(job_id).state.value == "queued"  # nothing was cancelled
    assert [j.id for j in app.list_jobs()] == [job_id]  # the app still works


def test_cli_jobs_filter_with_bad_text_is_one_line_and_exit_2(dsn, tmp_path):
    result = run_cli(dsn, "jobs", "--queue", f"q{ESCAPED}", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
