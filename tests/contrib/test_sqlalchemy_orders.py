"""skiplock.contrib.sqlalchemy with a real SQLAlchemy 2 model (an ``orders`` table) on the real server:
enqueue on a Session, Connection, AsyncSession or AsyncConnection in the caller's transaction, and a
handler's Session on the lease connection whose writes commit with the job."""

from __future__ import annotations

import asyncio

import pytest


from psycopg import conninfo  # noqa: E402
from sqlalchemy import String, create_engine, select  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column  # noqa: E402

import skiplock  # noqa: E402
from skiplock.contrib import sqlalchemy as sl  # noqa: E402


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="new")


def url(dsn: str, driver: str = "psycopg") -> str:
    """A SQLAlchemy URL for the test DSN (its libpq parameters go in the query string)."""
    params = conninfo.conninfo_to_dict(dsn)
    query = "&".join(f"{k}={v}" for k, v in params.items() if k != "dbname")
    return f"postgresql+{driver}:///{params['dbname']}?{query}"


@pytest.fixture
def engine(dsn):
    engine = create_engine(url(dsn))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def job_count(db) -> int:
    return db.execute("select count(*) from skiplock.jobs").fetchone()[0]


def test_enqueue_on_a_session_exists_only_if_it_commits(app, engine, db):
    with Session(engine) as s:
        s.add(Order(item="book"))
        sl.enqueue(app, s, "ship", {"item": "book"})
        assert job_count(db) == 0
        s.commit()
    with Session(engine) as s:
        s.add(Order(item="lamp"))
        sl.enqueue_many(app, s, [("ship", {"item": "lamp"}), ("ship", {"item": "lamp 2"})])
        s.rollback()
    assert db.execute("select args->>'item' from skiplock.jobs").fetchall() == [("book",)]
    assert db.execute("select item from orders").fetchall() == [("book",)]


def test_enqueue_on_a_connection_commit_as_you_go(app, engine, db):
    with engine.connect() as c:
        sl.enqueue(app, c, "ship", {"n": 1})
        c.commit()
        sl.enqueue(app, c, "ship", {"n": 2})  # closed without commit: discarded
    assert db.execute("select args from skiplock.jobs").fetchall() == [({"n": 1},)]


def test_enqueue_async_on_an_async_session_and_connection(app, dsn, engine, db):
    async def go():
        aengine = create_async_engine(url(dsn))
        try:
            async with AsyncSession(aengine) as s:
                s.add(Order(item="async book"))
                await sl.enqueue_async(app, s, "ship", {"via": "session"})
                await s.commit()
            async with AsyncSession(aengine) as s:
                await sl.enqueue_async(app, s, "ship", {"via": "rolled back session"})
                await s.rollback()
            async with aengine.connect() as c:
                await sl.enqueue_many_async(app, c, [("ship", {"via": "connection"})])
                await c.commit()
            async with aengine.connect() as c:
                await sl.enqueue_async(app, c, "ship", {"via": "closed connection"})
        finally:
            await aengine.dispose()

    asyncio.run(go())
    assert db.execute("select args->>'via' from skiplock.jobs order by id").fetchall() == [("session",), ("connection",)]
    assert db.execute("select item from orders").fetchall() == [("async book",)]


def test_enqueue_refuses_another_driver(app):
    with pytest.raises(skiplock.errors.ConfigurationError):
        sl.enqueue(app, object(), "ship")


def run_worker(app) -> None:
    app.worker(concurrency=1, handle_signals=False, poll_interval=0.05, maintenance=False).run(stop_when_empty=True)


def test_a_handlers_session_writes_commit_with_the_job_or_not_at_all(app, engine, db):
    @app.task("charge", max_attempts=1)
    def charge(job, order_id, fail=False):
        with sl.session(job, engine=engine) as s:
            order = s.get(Order, order_id)
            order.status = "charged"
            s.commit()  # releases the Session's savepoint only: still the job's transaction
            s.add(Order(item=f"receipt for {order_id}"))
        if fail:
            raise ValueError("card declined")
        return order_id

    with Session(engine) as s:
        book, lamp = Order(item="book"), Order(item="lamp")
        s.add_all([book, lamp])
        s.commit()
        ids = book.id, lamp.id
    app.enqueue("charge", {"order_id": ids[0]})
    bad = app.enqueue("charge", {"order_id": ids[1], "fail": True})
    run_worker(app)
    assert db.execute("select item, status from orders order by id").fetchall() == [
        ("book", "charged"), ("lamp", "new"), (f"receipt for {ids[0]}", "new")]
    assert app.get_job(bad).state == "failed"


def test_a_handlers_session_rolls_back_alone_and_cannot_end_the_lease(app, engine, db):
    @app.task("partial", max_attempts=1)
    def partial(job):
        with sl.session(job, engine=engine) as s:
            s.add(Order(item="kept"))
            s.commit()
            s.add(Order(item="undone"))
            s.flush()
            s.rollback()  # to the savepoint: "kept" stays
            s.connection().connection.dbapi_connection.commit()  # refused: the lease is not SQLAlchemy's

    @app.task("writes")
    def writes(job):
        with sl.session(job) as s:  # no engine given: the default postgresql+psycopg dialect
            s.add(Order(item="plain"))
        return [item for (item,) in job.conn.execute("select item from orders order by id")]

    app.enqueue("partial")
    done = app.enqueue("writes")
    run_worker(app)
    assert db.execute("select item from orders").fetchall() == [("plain",)]  # partial failed: all of it undone
    assert "cannot commit the job's transaction" in app.get_job(1).last_error
    assert app.get_job(done).result == ["plain"]


def test_under_the_claimed_lease_the_session_commits_with_the_fenced_done_write(app, engine, db):
    @app.task("claimed", lease="claimed", max_attempts=1)
    def claimed(job, fail=False):
        with sl.session(job, engine=engine) as s:
            s.add(Order(item="claimed" if not fail else "claimed, failed"))
        if fail:
            raise ValueError("no")

    ok = app.enqueue("claimed")
    bad = app.enqueue("claimed", {"fail": True})
    run_worker(app)
    assert (app.get_job(ok).state, app.get_job(bad).state) == ("done", "failed")
    assert db.execute("select item from orders").fetchall() == [("claimed",)]


def test_an_async_handler_uses_the_same_session(app, engine, db):
    @app.task("async_write", max_attempts=1)
    async def async_write(job, fail=False):
        await asyncio.sleep(0)
        with sl.session(job, engine=engine) as s:
            s.add(Order(item="async" if not fail else "async, failed"))
        if fail:
            raise ValueError("no")

    app.enqueue("async_write")
    app.enqueue("async_write", {"fail": True})
    run_worker(app)
    assert db.execute("select item from orders").fetchall() == [("async",)]


def test_on_the_asyncio_worker_an_async_session_writes_commit_with_the_job_or_not_at_all(dsn, engine, db):
    """``async_session(job)`` on the asyncio worker (``job.conn`` an AsyncConnection): its writes commit
    with the job, a failing handler's are undone, its rollback undoes its own writes alone, it cannot
    commit the lease; the sync ``session(job)`` refuses the AsyncConnection with a clear error."""
    aapp = skiplock.AsyncApp(dsn)
    aengine = create_async_engine(url(dsn))

    @aapp.task(name="charge", max_attempts=1)
    async def charge(job, order_id, fail=False):
        async with sl.async_session(job, engine=aengine) as s:
            order = await s.get(Order, order_id)
            order.status = "charged"
            s.add(Order(item=f"receipt for {order_id}"))
            await s.commit()  # releases the session's savepoint only: still the job's transaction
            s.add(Order(item="undone"))
            await s.flush()
            await s.rollback()  # to the savepoint: the order and its receipt stay
        if fail:
            raise ValueError("card declined")
        return (await (await job.conn.execute("select count(*) from orders")).fetchone())[0]

    @aapp.task(name="commit_the_lease", max_attempts=1)
    async def commit_the_lease(job):
        async with sl.async_session(job) as s:  # no engine given: the default postgresql+psycopg dialect
            s.add(Order(item="never"))
            await s.flush()
            raw = await s.connection()
            await (await raw.get_raw_connection()).driver_connection.commit()  # refused

    @aapp.task(name="sync_session", max_attempts=1)
    async def sync_session(job):
        with sl.session(job):
            pass

    with Session(engine) as s:
        book, lamp = Order(item="book"), Order(item="lamp")
        s.add_all([book, lamp])
        s.commit()
        ids = book.id, lamp.id

    async def main():
        ok = await aapp.enqueue("charge", {"order_id": ids[0]})
        bad = await aapp.enqueue("charge", {"order_id": ids[1], "fail": True})
        refused = await aapp.enqueue("commit_the_lease")
        wrong = await aapp.enqueue("sync_session")
        await aapp.run_async_worker(concurrency=2, max_connections=4, stop_when_empty=True)
        await aengine.dispose()
        return ok, bad, refused, wrong

    ok, bad, refused, wrong = asyncio.run(asyncio.wait_for(main(), 60))
    app = aapp.app
    try:
        assert db.execute("select item, status from orders order by id").fetchall() == [
            ("book", "charged"), ("lamp", "new"), (f"receipt for {ids[0]}", "new")]
        assert app.get_job(ok).state == "done" and app.get_job(ok).result == 3  # its own writes, seen in the lease
        assert app.get_job(bad).state == "failed" and "card declined" in app.get_job(bad).last_error
        assert app.get_job(refused).state == "failed"
        assert "cannot commit the job's transaction" in app.get_job(refused).last_error
        assert app.get_job(wrong).state == "failed" and "async_session(job)" in app.get_job(wrong).last_error
    finally:
        app.close()


def test_the_sqlalchemy_example(empty_dsn):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "sqlalchemy" / "orders.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env["SKIPLOCK_EXAMPLE_DSN"] = empty_dsn
    done = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["orders"] == [["book", "charged"], ["declined", "new"]]
    assert out["jobs"] == [["charge", "done", "charged"], ["charge", "failed", None]]
