"""A worker's claims name its tasks as one cached array literal (``text_array`` in
backend/postgres/queries.py): whatever characters a task name holds, the server reads back exactly
the names registered, and the sync and asyncio workers claim and run their jobs."""

from __future__ import annotations

import asyncio

import pytest

import skiplock
from skiplock.backend.postgres.queries import text_array

pytestmark = pytest.mark.timeout(60)

NAMES = ['plain', 'say "hi"', "back\\slash", "{braces},comma", " spaced ", "NULL", "ünï €😀", "'single'"]


def test_the_server_reads_the_literal_back_as_the_names(db):
    assert db.execute("SELECT %s::text[]", [text_array(tuple(NAMES))]).fetchone()[0] == NAMES


def _register(app, ran):
    for name in NAMES:
        def handler(job, n, name=name):
            ran.append((name, n))
            return name
        app.task(name=name)(handler)


def test_the_sync_worker_claims_jobs_of_every_such_task(app):
    ran = []
    _register(app, ran)
    # a job of a task this worker does not have: its claims must not take it
    other = app.enqueue_many([("not registered here", {"n": 0})])
    ids = app.enqueue_many([(name, {"n": i}) for i, name in enumerate(NAMES)])
    app.worker(concurrency=2, handle_signals=False, maintenance=False).run(stop_when_empty=True)
    assert sorted(ran) == sorted((name, i) for i, name in enumerate(NAMES))
    assert [app.get_job(i).result for i in ids] == NAMES
    assert app.get_job(other[0]).state == "queued"


def test_the_asyncio_worker_claims_jobs_of_every_such_task(dsn):
    aapp = skiplock.AsyncApp(dsn)
    ran = []
    _register(aapp, ran)

    async def main():
        await aapp.migrate()
        ids = [await aapp.enqueue(name, {"n": i}) for i, name in enumerate(NAMES)]
        await aapp.run_async_worker(concurrency=2, max_connections=2, stop_when_empty=True)
        return ids

    asyncio.run(asyncio.wait_for(main(), 45))
    assert sorted(ran) == sorted((name, i) for i, name in enumerate(NAMES))
