"""Sinks: "enqueue a skiplock job" fans out atomically (no external effect, exactly one job per message);
a transactional sink's failing message is rolled back alone; a sink with deliver_batch; custom sinks."""

from __future__ import annotations

import psycopg
import pytest
from outbox_support import FAST_RETRY, row, states

from skiplock.errors import ConnectionLost
from skiplock.outbox import EnqueueJobSink, PermanentDeliveryError


def jobs(db) -> list[tuple[str, dict, str]]:
    return [tuple(r) for r in db.execute("SELECT task, args, queue FROM skiplock.jobs ORDER BY id").fetchall()]


def test_enqueue_job_sink_turns_each_message_into_exactly_one_job(app, db):
    refs = app.outbox.put_many([("send_email", {"to": f"u{i}@example.com"}) for i in range(250)])
    bad = app.outbox.put("send_email", ["not", "an", "object"])
    relay = app.relay(EnqueueJobSink(app, queue="mail"), batch_size=100)
    assert relay.lease == "transaction"
    stats = relay.run(stop_when_empty=True)
    assert (stats.sent, stats.failed) == (250, 1)
    made = jobs(db)
    assert [args["to"] for _, args, _ in made] == [f"u{i}@example.com" for i in range(250)]
    assert {(task, queue) for task, _, queue in made} == {("send_email", "mail")}
    dead = row(db, bad.id)
    assert dead["state"] == "failed" and "not a JSON object" in dead["last_error"]
    assert all(row(db, r.id)["attempts"] == 1 for r in refs)
    app.relay(EnqueueJobSink(app)).run(stop_when_empty=True)
    assert len(jobs(db)) == 250, "a sent message was fanned out again"


def test_enqueue_job_sink_task_and_args_functions(app, db):
    app.outbox.put("order.created", {"order": 7}, key="customer-1")
    sink = EnqueueJobSink(app, task=lambda m: f"on_{m.topic.replace('.', '_')}",
                          args=lambda m: {"order": m.payload["order"], "idempotency_key": m.idempotency_key})
    app.relay(sink).run(stop_when_empty=True)
    (task, args, _), = jobs(db)
    assert task == "on_order_created" and args["order"] == 7 and len(args["idempotency_key"]) >= 32


class Recorder:
    """A transactional sink writing a row per message; the payload "boom" fails after its write."""

    transactional = True

    def __init__(self, batch: bool):
        self.batches = 0
        if batch:
            self.deliver_batch = self._deliver_batch

    def deliver(self, message, conn) -> None:
        conn.execute("INSERT INTO side (message_id) VALUES (%s)", [message.id])
        if message.payload == "boom":
            raise RuntimeError("boom after writing")

    def _deliver_batch(self, messages, conn) -> None:
        self.batches += 1
        for m in messages:
            self.deliver(m, conn)


@pytest.mark.parametrize("batch", [False, True])
def test_a_failing_message_of_a_transactional_sink_rolls_back_alone(app, db, batch):
    db.execute("CREATE TABLE side (message_id bigint)")
    refs = app.outbox.put_many([("t", "ok"), ("t", "boom"), ("t", "ok")])
    sink = Recorder(batch)
    app.relay(sink, retry=FAST_RETRY).run(stop_when_empty=True)
    assert sorted(r[0] for r in db.execute("SELECT message_id FROM side")) == [refs[0].id, refs[2].id]
    failing = row(db, refs[1].id)
    assert failing["state"] == "pending" and "boom after writing" in failing["last_error"]
    assert states(db) == {"sent": 2, "pending": 1}
    if batch:
        assert sink.batches == 1  # tried as a batch first, then message by message


def test_transaction_lease_rolls_back_everything_when_the_relay_connection_dies(app, dsn, db):
    """The seed's protocol: the batch's effects and its outcomes commit together or not at all."""
    db.execute("CREATE TABLE side (message_id bigint)")
    app.outbox.put_many([("t", "ok"), ("t", "ok")])

    class KillsItsOwnSession:
        transactional = True

        def deliver(self, message, conn) -> None:
            conn.execute("INSERT INTO side (message_id) VALUES (%s)", [message.id])
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])

    relay = app.relay(KillsItsOwnSession(), batch_size=10, poll_interval=0.01, max_reconnect_delay=0.05)
    with pytest.raises(ConnectionLost):  # a skiplock error: the relay is driver-free
        relay.run_once()
    assert db.execute("SELECT count(*) FROM side").fetchone()[0] == 0
    assert states(db) == {"pending": 2}
    assert db.execute("SELECT max(attempts) FROM skiplock.outbox").fetchone()[0] == 0


def test_an_external_sink_with_deliver_batch(app, db):
    calls = []

    class Batching:
        def deliver(self, message) -> None:  # the relay prefers deliver_batch when there is one
            raise AssertionError("not used")

        def deliver_batch(self, messages):
            calls.append([m.id for m in messages])
            return [PermanentDeliveryError("rejected") if m.payload == "no" else None for m in messages]

    refs = app.outbox.put_many([("t", "yes"), ("t", "no"), ("t", "yes")])
    app.relay(Batching(), batch_size=10).run(stop_when_empty=True)
    assert calls == [[r.id for r in refs]]
    assert states(db) == {"sent": 2, "failed": 1}


def test_a_sink_raising_an_unexpected_error_is_retried_with_its_traceback_kept(app, db):
    class Buggy:
        def deliver(self, message) -> None:
            raise KeyError("missing")

    ref = app.outbox.put("t", {})
    app.relay(Buggy(), retry=60).run(stop_when_empty=True)
    r = row(db, ref.id)
    assert r["state"] == "pending" and "KeyError: 'missing'" in r["last_error"] and "Traceback" in r["last_error"]
