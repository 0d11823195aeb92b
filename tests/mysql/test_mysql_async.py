"""AsyncApp on MariaDB without an async driver connection: its verbs run the sync App's in a thread
(aio.py), so they work on the MySQL backend as they are -- enqueue, enqueue_many with keys, counts,
and ``wait``, woken by the finishing write's notice (backend/mysql/notifications.py). Enqueueing on
the caller's own asyncio MySQL connection (``run_async``) is test_mysql_async_conn.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import skiplock


def test_async_app_enqueues_and_waits_for_a_result_on_mariadb(mariadb_dsn: str) -> None:
    async def scenario() -> tuple[Any, list[int], list[tuple[str, str, int]]]:
        aapp = skiplock.AsyncApp(mariadb_dsn)

        @aapp.app.task(name="double")
        def double(job: Any, n: int) -> int:
            return n * 2

        await aapp.migrate()
        try:
            job_id = await aapp.enqueue("double", {"n": 21})
            ids = await aapp.enqueue_many([("double", {"n": 1}, {"unique_key": "k"}),
                                           ("double", {"n": 2}, {"unique_key": "k"})])
            waiting = asyncio.ensure_future(aapp.wait(job_id, timeout=30))
            await asyncio.sleep(0.2)  # the waiter is registered and listening before the job runs
            worker = aapp.app.worker(concurrency=1, poll_interval=0.05, maintenance=False)
            runner = threading.Thread(target=lambda: worker.run(stop_when_empty=True), daemon=True)
            runner.start()
            result = await waiting
            await asyncio.to_thread(runner.join, 30)
            return result, ids, await aapp.counts()
        finally:
            await aapp.close()

    result, ids, counts = asyncio.run(scenario())
    assert result == 42
    assert ids[0] == ids[1]  # the second item's key is the first's
    assert counts == [("default", "done", 2)]
