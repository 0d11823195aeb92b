"""The outbox's promises (docs/outbox.md) on every backend, the same test code for each (outbox_backends.py):
put commits and rolls back with the caller's transaction, idempotency keys, keyed writers serialise,
SKIP LOCKED claims (no id cursor), two relays deliver each message once to a real HTTP receiver, per-key
order, retries with Retry-After, dead letters and redrive, the claimed lease's fence and rescuer, the
transaction lease (exactly once into jobs), prune, and a put waking a relay without its poll."""

from __future__ import annotations

import random
import threading
from typing import Iterator

import pytest
from outbox_backends import BACKENDS, Box
from outbox_receiver import Action
from outbox_support import FAST_RETRY, deliveries_by_message, wait_for

import skiplock
from skiplock.backend.outbox_base import Finish
from skiplock.outbox import EnqueueJobSink, HttpSink, InvalidMessage
from skiplock.retry import Constant


@pytest.fixture(params=BACKENDS, ids=lambda f: f.__name__)
def box(request: pytest.FixtureRequest) -> Iterator[Box]:
    b = request.param(request)
    try:
        yield b
    finally:
        b.close()




# ---- writing -----------------------------------------------------------------------------------------

def test_put_commits_and_rolls_back_with_the_callers_transaction(box: Box):
    app = box.app
    conn = box.connect()
    try:
        ref = app.outbox.put("order.created", {"order": 1}, conn=conn)
        more = app.outbox.put_many([("order.paid", {"order": 1}, "customer-1"), ("order.shipped", [1, 2])], conn=conn)
        assert box.count() == 0, "visible before the caller's transaction committed"
        conn.commit()
        assert box.count() == 3
        app.outbox.put("order.created", {"order": 2}, conn=conn)
        app.outbox.put_many([("order.paid", {"order": 2}, "customer-2")], conn=conn)
        conn.rollback()
        assert box.count() == 3, "a rolled-back transaction published a message"
        with pytest.raises(InvalidMessage):
            app.outbox.put("", {}, conn=conn)
    finally:
        conn.close()
    got = [box.row(r.id) for r in [ref, *more]]
    assert [(m["topic"], m["key"], m["payload"], m["state"], m["attempts"]) for m in got] == [
        ("order.created", None, {"order": 1}, "pending", 0), ("order.paid", "customer-1", {"order": 1}, "pending", 0),
        ("order.shipped", None, [1, 2], "pending", 0)]
    assert ref.idempotency_key == got[0]["idempotency_key"] and len(ref.idempotency_key) >= 32


def test_put_without_conn_and_on_an_autocommit_connection_commits_at_once(box: Box):
    box.app.outbox.put("t", [1, 2, 3])
    conn = box.connect(autocommit=True)
    try:
        box.app.outbox.put("t", "text", key="k", conn=conn)  # keyed: key lock + insert in one transaction
    finally:
        conn.close()
    assert box.count() == 2


def test_idempotency_keys_store_once_and_generated_ones_are_unique(box: Box):
    outbox = box.app.outbox
    first = outbox.put("t", {"n": 1}, idempotency_key="order-1-created")
    assert outbox.put("t", {"n": 1}, idempotency_key="order-1-created") == first
    refs = outbox.put_many([{"topic": "t", "payload": 1, "idempotency_key": "x"},
                            {"topic": "t", "payload": 2, "idempotency_key": "order-1-created"},
                            {"topic": "t", "payload": 3, "idempotency_key": "x"}])
    assert refs[1] == first and refs[0] == refs[2] and box.count() == 2
    many = outbox.put_many([("t", {"i": i}) for i in range(1200)])  # more than one INSERT on MySQL
    assert len({r.idempotency_key for r in many}) == 1200
    assert [r.id for r in many] == sorted(r.id for r in many), "ids not ascending in input order"


def test_writers_of_one_key_serialise_so_id_order_is_commit_order(box: Box):
    """T1 puts key k and stays open; T2's put of k waits for T1 (it cannot take an id before T1 ends),
    so T2's message has the larger id and commits later. Another key does not wait."""
    outbox = box.app.outbox
    t1, t2, t3 = box.connect(), box.connect(), box.connect()
    try:
        first = outbox.put("t", {"n": 1}, key="k", conn=t1)
        result: dict[str, object] = {}

        def second() -> None:
            result["ref"] = outbox.put("t", {"n": 2}, key="k", conn=t2)
            t2.commit()

        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: box.lock_waits() > 0, 10, "the second writer of key k to wait")
        other = outbox.put("t", {"n": 3}, key="other", conn=t3)  # a different key does not wait
        t3.commit()
        assert "ref" not in result
        t1.commit()
        thread.join(10)
        assert result["ref"].id > first.id and other.id < result["ref"].id  # type: ignore[attr-defined]
    finally:
        for c in (t1, t2, t3):
            c.close()


def test_prune_deletes_old_sent_messages_only(box: Box):
    a, b, c = box.app.outbox.put_many([("t", 1), ("t", 2, "k"), ("t", 3)])
    box.finished_ago(a.id, "sent", 7200)
    box.finished_ago(b.id, "failed", 7200)
    assert box.app.outbox.prune(3600) == 1
    assert sorted(m.id for m in box.app.outbox.list_messages()) == [b.id, c.id]
    assert box.app.outbox.prune(0) == 0
    again = box.app.outbox.put("t", 4, key="k")  # its key's lock row may be gone: taken anew
    assert box.row(again.id)["state"] == "pending"


# ---- relaying ----------------------------------------------------------------------------------------

def test_messages_committed_out_of_id_order_are_all_delivered(box: Box, receiver, sink):
    relay = box.app.relay(sink, poll_interval=0.02)
    slow = box.connect()
    try:
        early = box.app.outbox.put("t", {"n": "early"}, conn=slow)  # the smaller id, still uncommitted
        late = box.app.outbox.put("t", {"n": "late"})  # the larger id, committed first
        assert early.id < late.id
        relay.start()
        wait_for(lambda: box.row(late.id)["state"] == "sent", 10, "the later id to be delivered")
        # An `id > last_seen` cursor would now stand at late.id and never look at early.id again.
        assert [d.message_id for d in receiver.deliveries()] == [late.id]
        slow.commit()
        wait_for(lambda: box.row(early.id)["state"] == "sent", 10, "the earlier id, committed later, to be sent")
    finally:
        relay.stop()
        slow.close()
    assert sorted(e[1] for e in receiver.effects()) == [early.id, late.id]


def test_two_relays_running_together_deliver_each_message_once(box: Box, receiver):
    apps = [skiplock.App(box.dsn) for _ in range(2)]
    sinks = [HttpSink(receiver.url, timeout=60) for _ in range(2)]
    relays = [a.relay(s, batch_size=50, concurrency=8, poll_interval=0.02, name=f"relay-{i}")
              for i, (a, s) in enumerate(zip(apps, sinks))]
    try:
        for r in relays:
            r.start()
        wait_for(lambda: all(r.idle.is_set() for r in relays), 10, "both relays to be polling")
        box.app.outbox.put_many([("t", {"i": i}) for i in range(1000)])
        wait_for(lambda: box.all_sent(1000), 60, "1000 messages sent", on_timeout=lambda: str(box.states()))
    finally:
        for r, s, a in zip(relays, sinks, apps):
            r.stop()
            s.close()
            a.close()
    counts = deliveries_by_message(receiver)
    assert len(counts) == 1000 and set(counts.values()) == {1}, "a message was delivered twice"
    assert receiver.effect_count() == 1000
    assert all(r.stats.sent > 0 for r in relays) and sum(r.stats.sent for r in relays) == 1000


def test_per_key_ordering_delivers_one_at_a_time_in_commit_order(box: Box, receiver):
    keys = ["alice", "bob", "carol"]

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        conn = box.connect()
        try:
            for i in range(20):
                box.app.outbox.put("t", {"w": seed, "i": i}, key=rnd.choice(keys + [None]), conn=conn)
                conn.commit()
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # some first attempts fail: a key's head waits for its retry while the key's later messages wait
    receiver.script = lambda r: Action(status=500) if r.message_id % 7 == 0 and r.attempt == 1 else Action(hang=0.003)
    apps = [skiplock.App(box.dsn) for _ in range(2)]
    sinks = [HttpSink(receiver.url, timeout=60) for _ in range(2)]
    relays = [a.relay(s, batch_size=10, concurrency=8, poll_interval=0.01, retry=Constant(0.02))
              for a, s in zip(apps, sinks)]
    try:
        for r in relays:
            r.start()
        wait_for(lambda: box.all_sent(80), 30, "80 messages sent", on_timeout=lambda: str(box.states()))
    finally:
        for r, s, a in zip(relays, sinks, apps):
            r.stop()
            s.close()
            a.close()
    assert receiver.max_in_flight_per_key == 1, "two messages of one key were in flight at once"
    applied = receiver.effects()
    assert len(applied) == 80
    for key in keys:
        ids = [message_id for _, message_id, k in applied if k == key]
        assert ids == sorted(ids), f"key {key}: effects applied out of commit order: {ids}"
        tried = [d.message_id for d in receiver.deliveries() if d.key == key]
        assert tried == sorted(tried), f"key {key}: a later message was tried before an earlier one was sent"


def test_500_then_200_is_retried_and_retry_after_sets_the_least_delay(box: Box, receiver, sink):
    receiver.script = lambda r: (Action(status=429, headers={"Retry-After": "120"}) if r.payload == "later"
                                 else Action(status=500, body="database is down") if r.attempt == 1 else Action())
    refs = box.app.outbox.put_many([("t", {"i": i}) for i in range(10)])
    later = box.app.outbox.put("t", "later")
    relay = box.app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: box.all_sent(10), 20, "10 messages sent", on_timeout=lambda: str(box.states()))
    finally:
        relay.stop()
    for ref in refs:
        r = box.row(ref.id)
        assert r["attempts"] == 2 and "HTTP 500" in r["last_error"] and "database is down" in r["last_error"]
    waiting = box.row(later.id)
    assert waiting["state"] == "pending" and "HTTP 429" in waiting["last_error"]
    assert 100 < box.seconds_until_available(later.id) <= 121
    assert receiver.effect_count() == 10


def test_max_attempts_and_4xx_end_failed_until_redriven(box: Box, receiver, sink):
    receiver.script = lambda r: Action(status=422, body="unknown customer") if r.topic == "bad" else Action(status=503)
    bad = box.app.outbox.put("bad", {})
    tired = box.app.outbox.put_many([{"topic": "t", "payload": i, "max_attempts": 3} for i in range(3)])
    relay = box.app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: box.states().get("failed") == 4, 20, "4 messages failed", on_timeout=lambda: str(box.states()))
    finally:
        relay.stop()
    dead = box.row(bad.id)
    assert (dead["attempts"], "permanent failure" in dead["last_error"], "HTTP 422" in dead["last_error"]) == (1, True, True)
    for ref in tired:
        r = box.row(ref.id)
        assert r["attempts"] == 3 and "gave up after attempt 3/3" in r["last_error"] and "HTTP 503" in r["last_error"]
    assert sorted(m.id for m in box.app.outbox.failed()) == sorted([bad.id, *(r.id for r in tired)])
    receiver.script = None  # the receiver is fixed
    assert box.app.outbox.redrive([bad.id]) == [bad.id]
    with pytest.raises(InvalidMessage, match=f"{bad.id} is pending"):
        box.app.outbox.redrive([bad.id])
    assert box.app.outbox.redrive(topic="t") == sorted(r.id for r in tired)
    box.app.relay(sink, retry=FAST_RETRY).run(stop_when_empty=True)
    assert box.all_sent(4) and box.app.outbox.failed() == [] and box.row(bad.id)["attempts"] == 1


def test_claimed_lease_fencing_and_the_rescuer(box: Box):
    store = box.app.outbox.store
    ref = box.app.outbox.put("t", {}, max_attempts=2)
    claimed, _ = store.claim_lease("relay-A/1", None, 10, 30)
    assert [m.id for m in claimed] == [ref.id] and claimed[0].attempt == 1
    assert store.claim_lease("relay-B/1", None, 10, 30)[0] == []  # in flight: not claimable
    box.expire_leases()
    again, rescued = store.claim_lease("relay-B/2", None, 10, 30)  # B's claim rescues A's expired lease
    assert rescued == 1 and [m.attempt for m in again] == [2]
    assert store.finish_lease("relay-A/1", [Finish(ref.id, "sent")]) == []  # A is too late: fenced out
    assert box.row(ref.id)["owner"] == "relay-B/2"
    box.expire_leases()  # B stalls past its lease too; its last attempt: the rescuer dead-letters it
    assert store.claim_lease("relay-C/1", None, 10, 30) == ([], 1)
    r = box.row(ref.id)
    assert r["state"] == "failed" and "expired before it reported an outcome" in r["last_error"]
    assert store.finish_lease("relay-B/2", [Finish(ref.id, "sent")]) == []


def test_transaction_lease_claims_skip_each_other_and_a_rollback_returns_them(box: Box, receiver, sink):
    box.app.outbox.put_many([("t", i) for i in range(30)])
    store = box.app.outbox.store
    a, b = store.open_lease("test-a"), store.open_lease("test-b")
    try:
        held, other = a.claim(None, 10), b.claim(None, 100)
        assert len(held) == 10 and len(other) == 20 and not {m.id for m in held} & {m.id for m in other}
        a.rollback()
        b.rollback()
    finally:
        a.close()
        b.close()
    box.app.relay(sink, lease="transaction", batch_size=7).run(stop_when_empty=True)
    assert box.all_sent(30) and len(receiver.deliveries()) == 30
    assert {m.attempts for m in box.app.outbox.list_messages(limit=100)} == {1}


def test_enqueue_job_sink_makes_each_message_one_job_in_the_relays_transaction(box: Box):
    box.app.outbox.put_many([("send_email", {"to": "a@example.com"}), ("send_email", {"to": "b@example.com"}),
                             ("send_email", "not an object")])
    relay = box.app.relay(EnqueueJobSink(box.app), batch_size=10)
    relay.run(stop_when_empty=True)
    assert box.jobs() == [("send_email", {"to": "a@example.com"}), ("send_email", {"to": "b@example.com"})]
    assert box.states() == {"sent": 2, "failed": 1}
    assert (relay.stats.sent, relay.stats.failed) == (2, 1)


def test_a_put_wakes_an_idle_relay_before_its_next_poll(box: Box, receiver, sink):
    """The relay polls once a minute here: only the put's wake-up (NOTIFY on PostgreSQL, the polled
    MAX(id) on MySQL) can deliver the message within the wait."""
    relay = box.app.relay(sink, poll_interval=60).start()
    try:
        wait_for(lambda: relay.idle.is_set() and relay.listener is not None and relay.listener.listening.is_set(),
                 10, "the relay to be idle and listening")
        ref = box.app.outbox.put("t", {"wake": True})
        wait_for(lambda: box.row(ref.id)["state"] == "sent", 20, "the message sent after a wake-up")
    finally:
        relay.stop()
    assert relay.listener is not None and relay.listener.notifications >= 1


def test_a_claim_never_waits_on_a_held_message_and_skips_its_keys_later_ones(box: Box):
    """Relay A's transaction lease holds key k's first message; B's claim returns at once (never waiting
    on A's row lock, nor reading it with a locking read), without k's later message, with the rest."""
    head = box.app.outbox.put("t", 1, key="k")
    behind = box.app.outbox.put("t", 2, key="k")
    free = box.app.outbox.put_many([("t", 3), ("t", 4, "other")])
    store = box.app.outbox.store
    a, b = store.open_lease("test-a"), store.open_lease("test-b")
    try:
        assert [m.id for m in a.claim(None, 1)] == [head.id]
        got = [m.id for m in b.claim(None, 10)]
        assert got == [r.id for r in free] and behind.id not in got
        assert box.lock_waits() == 0
        a.finish([Finish(head.id, "sent")])
        a.commit()
        b.rollback()
        assert [m.id for m in b.claim(None, 10)] == [behind.id, *(r.id for r in free)]
        b.rollback()
    finally:
        a.close()
        b.close()


# ---- a relay process killed mid-delivery ---------------------------------------------------------------

def test_relay_process_sigkilled_mid_delivery_loses_nothing(box: Box, receiver, spawn):
    """A real relay process (the CLI) is SIGKILLed after the receiver applied a message but before the
    relay marked it sent. A second relay rescues the dead one's batch once its lease expires: every
    message is sent, the victim's redelivered (attempt 2), and every effect applied once (dedup)."""
    import signal
    from collections import Counter

    refs = box.app.outbox.put_many([("t", {"i": i}) for i in range(30)])
    victim_message = refs[0].id
    release = threading.Event()
    receiver.script = lambda r: Action(hold=release) if r.message_id == victim_message and r.attempt == 1 else Action()
    args = ("--webhook", receiver.url, "--timeout", "60", "--lease-seconds", "1", "--batch-size", "10",
            "--concurrency", "4", "--poll-interval", "0.05")
    victim = spawn.relay(box.dsn, *args)
    try:
        assert receiver.held.wait(30), f"the relay never delivered\n{victim.output()}"
        in_hand = box.row(victim_message)
        assert in_hand["state"] == "delivering" and f":{victim.pid}:" in in_hand["owner"]
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
    finally:
        release.set()
    batch = [int(r[0]) for r in box.query("SELECT id FROM {outbox} WHERE owner LIKE %s", (f"%:{victim.pid}:%",))]
    assert victim_message in batch

    survivor = spawn.relay(box.dsn, *args)
    wait_for(lambda: box.all_sent(30), 30, "every message sent after the crash",
             on_timeout=lambda: f"{box.states()}\n{survivor.output()}")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output()
    assert "returned 10 message(s) with an expired lease to the queue" in survivor.output()
    deliveries = Counter(d.message_id for d in receiver.deliveries())
    assert deliveries[victim_message] == 2, "the message delivered before the crash was not redelivered"
    assert set(batch) <= {d.message_id for d in receiver.deliveries() if d.attempt == 2}
    assert set(deliveries) == {r.id for r in refs} and max(deliveries.values()) == 2
    effects = Counter(message_id for _, message_id, _ in receiver.effects())
    assert sum(effects.values()) == 30 and set(effects.values()) == {1}, "an effect applied twice or never"
    assert box.row(victim_message)["attempts"] == 2


def test_transaction_lease_session_killed_mid_batch_loses_nothing(box: Box):
    """A transaction-lease relay's session is ended from outside (an operator's kill, a crashed
    connection) while its transactional sink holds the batch, its jobs already written: the server
    rolls all of it back -- no job, no outcome -- and the relay's next pass makes each message exactly
    one job. A rolled-back attempt is not counted (attempts 1)."""
    from skiplock.backend.outbox_base import Message

    holding, release = threading.Event(), threading.Event()
    sessions: list[int] = []
    inner = EnqueueJobSink(box.app)

    class HoldFirstBatch:
        transactional = True

        def deliver(self, message: Message, conn) -> None:
            self.deliver_batch([message], conn)

        def deliver_batch(self, messages: list[Message], conn) -> None:
            inner.deliver_batch(messages, conn)
            sessions.append(box.session_id(conn))
            if len(sessions) == 1:
                holding.set()
                release.wait(30)

    box.app.outbox.put_many([("job_task", {"i": i}) for i in range(5)])
    relay = box.app.relay(HoldFirstBatch(), batch_size=10, poll_interval=0.05, max_reconnect_delay=0.2, listen=False)
    relay.start()
    try:
        assert holding.wait(30), "the relay never delivered"
        assert box.states() == {"pending": 5}
        box.app.backend.terminate([sessions[0]])
        release.set()
        wait_for(lambda: box.all_sent(5), 30, "every message sent after the kill", on_timeout=lambda: str(box.states()))
    finally:
        release.set()
        relay.stop()
    assert len(sessions) >= 2 and sessions[-1] != sessions[0]
    assert sorted(args["i"] for _, args in box.jobs()) == list(range(5)), "a job of the killed batch survived"
    assert {m.attempts for m in box.app.outbox.list_messages()} == {1}
