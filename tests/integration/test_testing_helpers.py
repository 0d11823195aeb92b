"""skiplock.testing against the real database: rolled_back, run_inline, assert_enqueued, drain."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import skiplock
import skiplock.testing as sl
from skiplock.worker.executor import ResultNotStorable


@pytest.fixture
def shop(app, db):
    """An app with a few tasks and a table they write to."""
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")

    @app.task(name="place_order", queue="orders")
    def place_order(job, order_id, note="", items=()):
        job.conn.execute("INSERT INTO orders VALUES (%s, %s)", [order_id, note])
        app.enqueue("send_receipt", {"order_id": order_id}, queue="mail", conn=job.conn)
        return {"order": order_id, "items": items, "job": job.id, "attempt": job.attempt, "worker": job.worker}

    @app.task(name="send_receipt", queue="mail")
    def send_receipt(job, order_id):
        return f"receipt {order_id}"

    @app.task(name="explode", max_attempts=1)
    def explode(job, order_id):
        job.conn.execute("INSERT INTO orders VALUES (%s, 'from explode')", [order_id])
        raise ValueError(f"boom {order_id}")

    @app.task(name="unstorable")
    def unstorable(job):
        return {"nan": float("nan")}

    @app.task(name="snoozer")
    def snoozer(job, order_id):
        job.conn.execute("INSERT INTO orders VALUES (%s, 'from snoozer')", [order_id])
        return skiplock.Snooze(5)

    @app.task(name="async_task")
    async def async_task(job, n):
        job.conn.execute("INSERT INTO orders VALUES (%s, 'async')", [n])
        return n * 2

    return app


def _left_behind(db):
    return (db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0],
            db.execute("SELECT count(*) FROM orders").fetchone()[0])


# ---- rolled_back ------------------------------------------------------------------------------------


def test_rolled_back_leaves_nothing_behind(shop, db):
    with sl.rolled_back(shop) as conn:
        shop.enqueue("send_receipt", {"order_id": 1}, conn=conn)
        shop.enqueue_many([("send_receipt", {"order_id": i}) for i in range(2, 1500)], conn=conn)  # COPY too
        conn.execute("INSERT INTO orders VALUES (7, 'by the test')")
        sl.run_inline(shop, "place_order", {"order_id": 8}, conn=conn)
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 2  # visible inside
        assert len(sl.assert_enqueued(shop, task="send_receipt", conn=conn)) == 1500
        assert _left_behind(db) == (0, 0)  # and nowhere else
    assert _left_behind(db) == (0, 0)
    assert sl.drain(shop).done == 0  # a worker never saw them


def test_rolled_back_refuses_commit_and_rolls_back_on_error(shop, db):
    with pytest.raises(psycopg.ProgrammingError):
        with sl.rolled_back(shop) as conn:
            shop.enqueue("send_receipt", {"order_id": 1}, conn=conn)
            conn.commit()
    with pytest.raises(KeyError):
        with sl.rolled_back(shop) as conn:
            shop.enqueue("send_receipt", {"order_id": 2}, conn=conn)
            raise KeyError("the test failed")
    assert _left_behind(db) == (0, 0)


def test_rolled_back_needs_the_schema(empty_dsn):
    app = skiplock.App(empty_dsn)
    with pytest.raises(skiplock.SchemaError, match="skiplock migrate"):
        with sl.rolled_back(app):
            pass
    app.close()


# ---- run_inline -------------------------------------------------------------------------------------


def test_run_inline_runs_the_handler_on_the_test_transaction(shop, db):
    with sl.rolled_back(shop) as conn:
        result = sl.run_inline(shop, "place_order", {"order_id": 1, "note": "n", "items": ("a", "b")}, conn=conn)
        # as the worker hands them: args as stored (JSON: the tuple is a list), attempt 1, a real id
        assert result["items"] == ["a", "b"] and result["attempt"] == 1 and result["worker"] == sl.INLINE_WORKER
        assert conn.execute("SELECT id, note FROM orders").fetchall() == [(1, "n")]
        [ran] = sl.assert_enqueued(shop, task="place_order", state="done", conn=conn)
        assert ran.id == result["job"] and ran.result == result and ran.attempts == 1 and ran.queue == "orders"
        [receipt] = sl.assert_enqueued(shop, task="send_receipt", args={"order_id": 1}, queue="mail", conn=conn)
        assert receipt.state == "queued"
        assert sl.run_inline(shop, "send_receipt", receipt.args, conn=conn) == "receipt 1"
    assert _left_behind(db) == (0, 0)


def test_run_inline_handler_error_undoes_only_its_own_writes(shop, db):
    with sl.rolled_back(shop) as conn:
        conn.execute("INSERT INTO orders VALUES (1, 'by the test')")
        with pytest.raises(ValueError, match="boom 2"):
            sl.run_inline(shop, "explode", {"order_id": 2}, conn=conn)
        assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]  # explode's row is gone, ours is not
        [job] = sl.assert_enqueued(shop, task="explode", conn=conn)  # it did not finish: still queued
        assert job.attempts == 0
        with pytest.raises(skiplock.Snooze):  # returned, as a worker takes it: raised here, its writes undone
            sl.run_inline(shop, "snoozer", {"order_id": 3}, conn=conn)
        assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]
        with pytest.raises(ResultNotStorable, match="NaN"):
            sl.run_inline(shop, "unstorable", conn=conn)
        sl.assert_enqueued(shop, task="unstorable", conn=conn)
    assert _left_behind(db) == (0, 0)


def test_run_inline_async_handler_and_own_transaction(shop, db):
    assert sl.run_inline(shop, "async_task", {"n": 21}) == 42  # no conn: a rolled-back transaction of its own
    assert _left_behind(db) == (0, 0)


def test_run_inline_refuses_bad_input_as_enqueue_does(shop, db):
    with sl.rolled_back(shop) as conn:
        with pytest.raises(skiplock.UnknownTask, match="unknown task 'nope'.*place_order"):
            sl.run_inline(shop, "nope", {}, conn=conn)
        with pytest.raises(skiplock.InvalidJob, match="args: not valid JSON"):
            sl.run_inline(shop, "send_receipt", {"order_id": float("nan")}, conn=conn)
        with pytest.raises(skiplock.InvalidJob, match="queue must be text without NUL"):
            sl.run_inline(shop, "send_receipt", {"order_id": 1}, queue="q\x00", conn=conn)
        with pytest.raises(skiplock.InvalidJob, match="unique_key not accepted"):
            sl.run_inline(shop, "send_receipt", {"order_id": 1}, unique_key="k", conn=conn)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'order_idd'"):
            sl.run_inline(shop, "send_receipt", {"order_idd": 1}, conn=conn)  # the handler's own signature
        conn.execute("SELECT 1")  # still usable: every refusal left the transaction as it was
    with psycopg.connect(shop.dsn, autocommit=True) as auto:
        with pytest.raises(ValueError, match="autocommit"):
            sl.run_inline(shop, "send_receipt", {"order_id": 1}, conn=auto)
    assert _left_behind(db) == (0, 0)


# ---- assert_enqueued --------------------------------------------------------------------------------


def test_assert_enqueued_returns_the_matches_or_says_what_is_enqueued(shop):
    a = shop.enqueue("send_receipt", {"order_id": 1})
    b = shop.enqueue("send_receipt", {"order_id": 2}, queue="other")
    c = shop.enqueue("place_order", {"order_id": 3, "items": ["x"]})
    assert [j.id for j in sl.assert_enqueued(shop, task="send_receipt")] == [a, b]
    assert [j.id for j in sl.assert_enqueued(shop, task="send_receipt", queue="other")] == [b]
    assert [j.id for j in sl.assert_enqueued(shop, args={"order_id": 3, "items": ("x",)})] == [c]  # as JSON
    assert len(sl.assert_enqueued(shop, count=3)) == 3
    with pytest.raises(AssertionError) as missing:
        sl.assert_enqueued(shop, task="send_receipt", args={"order_id": 9})
    message = str(missing.value)
    assert message.startswith("expected a queued job with task='send_receipt', args={'order_id': 9}; none matches;")
    for job_id, line in ((a, "send_receipt queue='mail' args={'order_id': 1}"),
                         (b, "send_receipt queue='other' args={'order_id': 2}"),
                         (c, "place_order queue='orders' args={'items': ['x'], 'order_id': 3}")):
        assert f"#{job_id} {line}" in message, message
    with pytest.raises(AssertionError, match=r"expected 1 queued job\(s\) with task='send_receipt'; 2 match"):
        sl.assert_enqueued(shop, task="send_receipt", count=1)
    with pytest.raises(AssertionError, match="no job is failed"):
        sl.assert_enqueued(shop, state="failed")
    with pytest.raises(skiplock.InvalidJob, match="unknown state 'gone'"):
        sl.assert_enqueued(shop, state="gone")


def test_assert_enqueued_on_a_connection_sees_its_transaction_only(shop):
    committed = shop.enqueue("send_receipt", {"order_id": 1})
    with sl.rolled_back(shop) as conn:
        mine = shop.enqueue("send_receipt", {"order_id": 2}, conn=conn)
        assert [j.id for j in sl.assert_enqueued(shop, task="send_receipt", conn=conn)] == [committed, mine]
        assert [j.id for j in sl.assert_enqueued(shop, task="send_receipt")] == [committed]  # others: committed only
        with pytest.raises(AssertionError, match=f"#{committed} send_receipt"):
            sl.assert_enqueued(shop, task="place_order", conn=conn)


# ---- drain ------------------------------------------------------------------------------------------


def test_drain_runs_every_available_job_to_completion(shop, db):
    first = shop.enqueue("place_order", {"order_id": 1})
    shop.enqueue("place_order", {"order_id": 2})
    boom = shop.enqueue("explode", {"order_id": 3})
    later = shop.enqueue("send_receipt", {"order_id": 4}, delay=3600)  # not due: stays queued
    stats = sl.drain(shop)
    assert (stats.done, stats.failed, stats.retried) == (4, 1, 0)  # 2 orders + the 2 receipts they enqueued
    assert shop.get_job(first).state == "done" and shop.get_job(first).result["worker"] != sl.INLINE_WORKER
    assert shop.get_job(boom).state == "failed" and "boom 3" in shop.get_job(boom).last_error
    assert shop.get_job(later).state == "queued"
    assert sorted(r[0] for r in db.execute("SELECT id FROM orders")) == [1, 2]
    assert len(sl.assert_enqueued(shop, task="send_receipt", state="done")) == 2
    assert sl.drain(shop).done == 0  # nothing left that is due


def test_drain_only_the_queues_asked_for(shop):
    receipt = shop.enqueue("send_receipt", {"order_id": 1})
    order = shop.enqueue("place_order", {"order_id": 2})
    assert sl.drain(shop, queues=["mail"]).done == 1
    assert shop.get_job(receipt).state == "done" and shop.get_job(order).state == "queued"
    assert sl.drain(shop, ["orders", "mail"], concurrency=2).done == 2  # the order, then its receipt


# ---- the documented examples (README.md, docs/testing.md) run as written ----------------------------


def test_the_readme_example(app, db):
    db.execute("CREATE TABLE sent (addr text)")

    @app.task(name="send_welcome_email", queue="default", max_attempts=5)
    def send_welcome_email(job, to):
        job.conn.execute("insert into sent(addr) values (%s)", [to])

    with sl.rolled_back(app) as conn:
        sl.run_inline(app, "send_welcome_email", {"to": "a@example.com"}, conn=conn)
        assert conn.execute("select addr from sent").fetchall() == [("a@example.com",)]
        app.enqueue("send_welcome_email", {"to": "b@example.com"}, conn=conn)
        sl.assert_enqueued(app, task="send_welcome_email", conn=conn)

    app.enqueue("send_welcome_email", {"to": "c@example.com"})
    assert sl.drain(app).done == 1
    assert db.execute("SELECT addr FROM sent").fetchall() == [("c@example.com",)]


def test_the_docs_testing_examples(app, db):
    db.execute("CREATE TABLE users (email text)")

    @app.task(name="signup")
    def signup(job, email):
        job.conn.execute("insert into users(email) values (%s)", [email])
        app.enqueue("send_welcome_email", {"to": email}, conn=job.conn)
        return {"email": email}

    @app.task(name="send_welcome_email", queue="mail")
    def send_welcome_email(job, to):
        pass

    with sl.rolled_back(app) as conn:
        result = sl.run_inline(app, "signup", {"email": "a@example.com"}, conn=conn)
        assert result == {"email": "a@example.com"}
        assert conn.execute("select email from users").fetchall() == [("a@example.com",)]
        sl.assert_enqueued(app, task="send_welcome_email", args={"to": "a@example.com"}, queue="mail", conn=conn)
        sl.assert_enqueued(app, task="signup", state="done", conn=conn)
        app.enqueue("signup", {"email": "c@example.com"}, conn=conn)
        with pytest.raises(AssertionError) as shown:
            sl.assert_enqueued(app, task="send_welcome_email", args={"to": "b@example.com"}, conn=conn)
        first, *listed = str(shown.value).splitlines()
        assert first == ("expected a queued job with task='send_welcome_email', args={'to': 'b@example.com'}; "
                         "none matches; queued jobs (2):")
        assert [line.split(" ", 3)[3] for line in listed] == [
            "send_welcome_email queue='mail' args={'to': 'a@example.com'}",
            "signup queue='default' args={'email': 'c@example.com'}"]
    assert db.execute("SELECT count(*) FROM users").fetchone()[0] == 0

    app.enqueue("signup", {"email": "a@example.com"})
    stats = sl.drain(app)
    assert (stats.done, stats.failed) == (2, 0)


def test_helpers_refuse_what_is_not_a_test_connection(shop):
    async def main():
        async with await psycopg.AsyncConnection.connect(shop.dsn) as aconn:
            with pytest.raises(TypeError, match="conn must be a psycopg Connection .* got AsyncConnection"):
                sl.run_inline(shop, "send_receipt", {"order_id": 1}, conn=aconn)
            with pytest.raises(TypeError, match="got AsyncConnection"):
                sl.assert_enqueued(shop, conn=aconn)

    asyncio.run(main())
    with pytest.raises(TypeError, match="got str"):
        sl.assert_enqueued(shop, conn="postgresql://u:secret@h/db")
