"""skiplock in a FastAPI (any ASGI) app -- docs/fastapi.md.

- the lifespan migrates, runs a worker (``AsyncApp.run_worker``: a thread; the event loop stays free)
  and, at shutdown, stops it gracefully and closes the pools;
- ``POST /users`` inserts a user and enqueues ``send_welcome`` in the request's own transaction (a
  psycopg ``AsyncConnection`` from the app's pool): the job exists only if the request commits, so
  ``?fail=true`` (the endpoint fails after enqueueing) leaves neither a user nor a job;
- ``GET /results/{job_id}`` awaits the job's result (``AsyncApp.wait``);
- the dashboard is mounted at ``/jobs`` (viewer token ``SKIPLOCK_DASHBOARD_TOKEN``).

Run it: ``SKIPLOCK_EXAMPLE_DSN=... SKIPLOCK_DASHBOARD_TOKEN=... uvicorn app:api`` (from this folder).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, AsyncIterator

from fastapi import FastAPI, HTTPException
from psycopg_pool import AsyncConnectionPool

import skiplock
from skiplock.dashboard import create_app
from skiplock.errors import JobFailed, JobNotFound, WaitTimeout


def create(dsn: str, dashboard_token: str) -> FastAPI:
    aapp = skiplock.AsyncApp(dsn)
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)

    @aapp.task("send_welcome", max_attempts=3)
    def send_welcome(job: skiplock.Job, user_id: int) -> dict[str, Any]:
        # in the job's transaction: the flag commits with the job's completion, exactly once
        job.conn.execute("update users set welcomed = true where id = %s", [user_id])
        return {"welcomed": user_id}

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        await aapp.migrate()
        await pool.open()
        async with pool.connection() as conn:
            await conn.execute("create table if not exists users (id bigserial primary key, name text not null, "
                               "welcomed boolean not null default false)")
        worker = asyncio.create_task(aapp.run_worker(concurrency=2, poll_interval=0.1))
        try:
            yield
        finally:
            worker.cancel()  # finishes the jobs in flight, then stops
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await pool.close()
            await aapp.close()

    api = FastAPI(lifespan=lifespan)

    @api.post("/users")
    async def create_user(name: str, fail: bool = False) -> dict[str, int]:
        async with pool.connection() as conn, conn.transaction():  # the request's transaction
            cur = await conn.execute("insert into users (name) values (%s) returning id", [name])
            (user_id,) = await cur.fetchone()
            job_id = await aapp.enqueue("send_welcome", {"user_id": user_id}, conn=conn)
            if fail:
                raise HTTPException(500, "failed after enqueueing: the user and the job are rolled back")
        return {"user_id": user_id, "job_id": job_id}

    @api.get("/results/{job_id}")
    async def result(job_id: int, timeout: float = 10.0) -> dict[str, Any]:
        try:
            return {"job_id": job_id, "result": await aapp.wait(job_id, timeout)}
        except JobFailed as exc:
            raise HTTPException(409, str(exc)) from None
        except WaitTimeout:
            raise HTTPException(504, f"job {job_id} did not finish within {timeout:g}s") from None
        except JobNotFound:
            raise HTTPException(404, f"no job {job_id}") from None

    api.mount("/jobs", create_app(aapp.app, token=dashboard_token))
    return api


if "SKIPLOCK_EXAMPLE_DSN" in os.environ:  # `uvicorn app:api`
    api = create(os.environ["SKIPLOCK_EXAMPLE_DSN"], os.environ["SKIPLOCK_DASHBOARD_TOKEN"])
