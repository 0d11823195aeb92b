"""The relay against a real PostgreSQL and a real HTTP receiver on 127.0.0.1: SKIP LOCKED claims (no id
cursor), several relays at once, retries and dead letters, timeouts, per-key ordering, lease fencing."""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Iterator
from email.utils import format_datetime

import psycopg
import pytest
from outbox_receiver import Action
from outbox_support import FAST_RETRY, deliveries_by_message, all_sent, row, states, wait_for

import skiplock
from skiplock.backend.outbox_base import Finish
from skiplock.errors import ConfigurationError
from skiplock.outbox import EnqueueJobSink, HttpSink
from skiplock.outbox.sinks import parse_retry_after
from skiplock.outbox.policy import DEFAULT_RETRY
from skiplock.retry import Constant


@contextmanager
def running(relays, sinks, apps) -> Iterator[None]:
    """Relays started (in threads) for the block; then stopped, and their sinks and apps closed."""
    try:
        for r in relays:
            r.start()
        yield
    finally:
        for r in relays:
            r.stop()
        for s, a in zip(sinks, apps):
            s.close()
            a.close()




def test_messages_committed_out_of_id_order_are_all_delivered(app, dsn, db, receiver, sink):
    relay = app.relay(sink, poll_interval=0.02)
    with psycopg.connect(dsn) as slow:
        early = app.outbox.put("t", {"n": "early"}, conn=slow)  # the smaller id, still uncommitted
        late = app.outbox.put("t", {"n": "late"})  # the larger id, committed first
        assert early.id < late.id
        relay.start()
        try:
            wait_for(lambda: row(db, late.id)["state"] == "sent", 10, "the later id to be delivered")
            # An `id > last_seen` cursor would now stand at late.id and never look at early.id again.
            assert [d.message_id for d in receiver.deliveries()] == [late.id]
            slow.commit()
            wait_for(lambda: row(db, early.id)["state"] == "sent", 10, "the earlier id, committed later, to be delivered")
        finally:
            relay.stop()
    assert sorted(d.message_id for d in receiver.deliveries()) == [early.id, late.id]
    assert sorted(e[1] for e in receiver.effects()) == [early.id, late.id]


def test_delivery_carries_payload_topic_key_and_a_stable_idempotency_key(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=500) if r.attempt == 1 else Action()
    ref = app.outbox.put("orders/created ünïcode", {"order": 7, "items": [1, 2]}, key="customer 42")
    relay = app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: all_sent(db, 1), 10, "the message to be sent")
    finally:
        relay.stop()
    first, second = receiver.deliveries()
    assert first.idempotency_key == second.idempotency_key == ref.idempotency_key
    assert (second.topic, second.key, second.payload) == ("orders/created ünïcode", "customer 42", {"order": 7, "items": [1, 2]})
    assert (first.attempt, second.attempt) == (1, 2)


def test_two_relays_running_together_deliver_each_message_once(dsn, db, app, receiver):
    apps = [skiplock.App(dsn) for _ in range(2)]
    sinks = [HttpSink(receiver.url, timeout=60) for _ in range(2)]
    relays = [a.relay(s, batch_size=50, concurrency=8, poll_interval=0.02, name=f"relay-{i}")
              for i, (a, s) in enumerate(zip(apps, sinks))]
    with running(relays, sinks, apps):
        wait_for(lambda: all(r.idle.is_set() for r in relays), 10, "both relays to be polling")
        app.outbox.put_many([("t", {"i": i}) for i in range(2000)])
        wait_for(lambda: all_sent(db, 2000), 60, "2000 messages sent", on_timeout=lambda: str(states(db)))
    per_message = deliveries_by_message(receiver)
    assert len(per_message) == 2000 and set(per_message.values()) == {1}, "a message was delivered twice"
    assert receiver.effect_count() == 2000
    assert all(r.stats.sent > 0 for r in relays), [r.stats for r in relays]
    assert sum(r.stats.sent for r in relays) == 2000


def test_receiver_returning_500_then_200_is_retried_with_backoff(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=500, body="database is down") if r.attempt == 1 else Action()
    refs = app.outbox.put_many([("t", {"i": i}) for i in range(20)])
    relay = app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: all_sent(db, 20), 20, "20 messages sent", on_timeout=lambda: str(states(db)))
    finally:
        relay.stop()
    assert set(deliveries_by_message(receiver).values()) == {2}
    assert receiver.effect_count() == 20
    for ref in refs:
        r = row(db, ref.id)
        assert r["attempts"] == 2
        assert "HTTP 500" in r["last_error"] and "database is down" in r["last_error"]
    assert (relay.stats.sent, relay.stats.retried, relay.stats.failed) == (20, 20, 0)


def test_receiver_hanging_past_the_timeout_is_retried_and_the_effect_applies_once(app, db, receiver):
    # The receiver applies the effect, then hangs past the sink's timeout on the first attempt: the
    # relay cannot know it worked and retries; the receiver's dedup turns the retry into a no-op.
    receiver.script = lambda r: Action(hang=2.0) if r.attempt == 1 else Action()
    sink = HttpSink(receiver.url, timeout=0.3)
    refs = app.outbox.put_many([("t", {"i": i}) for i in range(5)])
    relay = app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: all_sent(db, 5), 20, "5 messages sent", on_timeout=lambda: str(states(db)))
    finally:
        relay.stop()
        sink.close()
    assert set(deliveries_by_message(receiver).values()) == {2}
    assert receiver.effect_count() == 5, "the redelivery after a timeout applied the effect twice"
    for ref in refs:
        assert "no response within 0.3s" in row(db, ref.id)["last_error"]


def test_4xx_is_a_permanent_failure_kept_as_a_dead_letter_until_redriven(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=422, body="unknown customer") if r.topic == "bad" else Action()
    good = app.outbox.put("good", {})
    bad = app.outbox.put("bad", {})
    relay = app.relay(sink, poll_interval=0.02, retry=FAST_RETRY)
    relay.run(stop_when_empty=True)
    assert row(db, good.id)["state"] == "sent"
    dead = row(db, bad.id)
    assert (dead["state"], dead["attempts"]) == ("failed", 1)
    assert "permanent failure" in dead["last_error"] and "HTTP 422" in dead["last_error"]
    assert [m.id for m in app.outbox.failed()] == [bad.id]
    receiver.script = None  # the receiver is fixed
    assert app.outbox.redrive([bad.id]) == [bad.id]
    relay.run(stop_when_empty=True)
    assert row(db, bad.id)["state"] == "sent" and app.outbox.failed() == []


def test_max_attempts_ends_failed_with_the_last_error_then_redrive_all(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=503)
    refs = app.outbox.put_many([{"topic": "t", "payload": i, "max_attempts": 3} for i in range(3)])
    relay = app.relay(sink, poll_interval=0.02, retry=FAST_RETRY).start()
    try:
        wait_for(lambda: states(db).get("failed") == 3, 20, "3 messages failed", on_timeout=lambda: str(states(db)))
    finally:
        relay.stop()
    for ref in refs:
        r = row(db, ref.id)
        assert r["attempts"] == 3 and "gave up after attempt 3/3" in r["last_error"] and "HTTP 503" in r["last_error"]
    assert len(receiver.deliveries()) == 9
    receiver.script = None
    assert app.outbox.redrive() == [r.id for r in refs]
    relay.run(stop_when_empty=True)
    assert all_sent(db, 3) and receiver.effect_count() == 3


def _wait_of(db, message_id: int) -> float:
    return db.execute("SELECT extract(epoch FROM available_at - now()) FROM skiplock.outbox WHERE id = %s",
                      [message_id]).fetchone()[0]


def test_retry_after_header_sets_the_least_delay(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=429, headers={"Retry-After": "120"})
    ref = app.outbox.put("t", {})
    app.relay(sink, retry=FAST_RETRY).run(stop_when_empty=True)
    r = row(db, ref.id)
    assert r["state"] == "pending" and "HTTP 429" in r["last_error"]
    assert 100 < _wait_of(db, ref.id) <= 121


def test_retry_after_as_an_http_date_sets_the_least_delay_within_the_sinks_bound(app, db, receiver):
    in_two_minutes = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True)
    next_year = format_datetime(datetime.now(timezone.utc) + timedelta(days=365), usegmt=True)
    answers = {"soon": in_two_minutes, "far": next_year, "past": "Sun, 06 Nov 1994 08:49:37 GMT", "junk": "tomorrow"}
    receiver.script = lambda r: (Action(status=503, headers={"Retry-After": answers[r.payload["case"]]})
                                 if r.attempt == 1 else Action())
    refs = {case: app.outbox.put("t", {"case": case}) for case in answers}
    sink = HttpSink(receiver.url, timeout=60, max_retry_after=600)
    relay = app.relay(sink, retry=FAST_RETRY, poll_interval=0.02).start()
    try:
        wait_for(lambda: all(row(db, refs[c].id)["state"] == "sent" for c in ("past", "junk")), 10,
                 "a past or unreadable date to leave the delay to the policy (50 ms)")
    finally:
        relay.stop()
        sink.close()
    soon, far = row(db, refs["soon"].id), row(db, refs["far"].id)
    assert soon["state"] == far["state"] == "pending" and "HTTP 503" in soon["last_error"]
    assert 100 < _wait_of(db, refs["soon"].id) <= 121  # whole seconds: the date's precision
    assert 590 < _wait_of(db, refs["far"].id) <= 600  # a year away: clamped to max_retry_after


def test_parse_retry_after_reads_seconds_and_all_three_http_date_forms():
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after(None, now, 86400) is None
    assert parse_retry_after("120", now, 86400) == 120
    assert parse_retry_after(" 7 ", now, 86400) == 7
    assert parse_retry_after("Tue, 01 Dec 2026 12:02:00 GMT", now, 86400) == 120  # IMF-fixdate
    assert parse_retry_after("Tuesday, 01-Dec-26 12:00:30 GMT", now, 86400) == 30  # obsolete RFC 850
    assert parse_retry_after("Tue Dec  1 12:00:05 2026", now, 86400) == 5  # obsolete asctime
    assert parse_retry_after("Tue, 01 Dec 2026 11:00:00 GMT", now, 86400) == 0  # past: no extra wait
    assert parse_retry_after("Wed, 01 Dec 2027 12:00:00 GMT", now, 86400) == 86400  # clamped
    assert parse_retry_after("100000", now, 86400) == 86400
    assert parse_retry_after("-5", now, 86400) == 0
    for junk in ("", "soon", "nan", "inf", "Tue, 99 Foo 2026 12:00:00 GMT"):
        assert parse_retry_after(junk, now, 86400) is None, junk


def test_per_key_ordering_delivers_one_at_a_time_in_commit_order(app, dsn, db, receiver):
    # Writers in several threads commit in an interleaved order; some first attempts fail (500), so
    # a key's head waits for its retry while later messages of the key must wait behind it.
    keys = ["alice", "bob", "carol"]

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(dsn) as conn:
            for i in range(20):
                key = rnd.choice(keys + [None])
                app.outbox.put("t", {"w": seed, "i": i}, key=key, conn=conn)
                conn.commit()

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    receiver.script = lambda r: Action(status=500) if r.message_id % 7 == 0 and r.attempt == 1 else Action(hang=0.003)
    apps = [skiplock.App(dsn) for _ in range(2)]
    sinks = [HttpSink(receiver.url, timeout=60) for _ in range(2)]
    relays = [a.relay(s, batch_size=10, concurrency=8, poll_interval=0.01, retry=Constant(0.02))
              for a, s in zip(apps, sinks)]
    with running(relays, sinks, apps):
        wait_for(lambda: all_sent(db, 80), 30, "80 messages sent", on_timeout=lambda: str(states(db)))
    assert receiver.max_in_flight_per_key == 1, "two messages of one key were in flight at once"
    applied = receiver.effects()
    assert len(applied) == 80
    for key in keys:
        ids = [message_id for _, message_id, k in applied if k == key]
        assert ids == sorted(ids), f"key {key}: effects applied out of commit order: {ids}"
        attempts = [d.message_id for d in receiver.deliveries() if d.key == key]
        assert attempts == sorted(attempts), f"key {key}: a later message was tried before an earlier one was sent"


def test_a_dead_lettered_message_does_not_hold_up_its_key(app, db, receiver, sink):
    receiver.script = lambda r: Action(status=400) if r.payload == "poison" else Action()
    first = app.outbox.put("t", "poison", key="k")
    second = app.outbox.put("t", "fine", key="k")
    relay = app.relay(sink, poll_interval=0.02)
    relay.run(stop_when_empty=True)
    relay.run(stop_when_empty=True)
    assert (row(db, first.id)["state"], row(db, second.id)["state"]) == ("failed", "sent")


def test_claimed_lease_fencing_and_the_rescuer(app, db):
    store = app.outbox.store
    ref = app.outbox.put("t", {}, max_attempts=2)
    claimed, _ = store.claim_lease("relay-A/1", None, 10, 1.0)
    assert [m.id for m in claimed] == [ref.id] and claimed[0].attempt == 1
    assert store.claim_lease("relay-B/1", None, 10, 30)[0] == []  # in flight: not claimable
    wait_for(lambda: db.execute("SELECT lease_expires_at < now() FROM skiplock.outbox").fetchone()[0], 10, "lease expiry")
    again, rescued = store.claim_lease("relay-B/2", None, 10, 30)  # B's claim rescues A's expired lease
    assert rescued == 1 and [m.attempt for m in again] == [2]
    assert store.finish_lease("relay-A/1", [Finish(ref.id, "sent")]) == []  # A is too late: fenced out
    assert row(db, ref.id)["owner"] == "relay-B/2"
    # B stalls past its lease too; this was the last attempt, so the rescuer dead-letters the message.
    db.execute("UPDATE skiplock.outbox SET lease_expires_at = now() - interval '1 second'")
    assert store.claim_lease("relay-C/1", None, 10, 30) == ([], 1)
    r = row(db, ref.id)
    assert r["state"] == "failed" and "expired before it reported an outcome" in r["last_error"]
    assert store.finish_lease("relay-B/2", [Finish(ref.id, "sent")]) == []


def test_transaction_lease_holds_row_locks_and_delivers(app, dsn, db, receiver, sink):
    refs = app.outbox.put_many([("t", i) for i in range(30)])
    store = app.outbox.store
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        held = store.claim_locked(a, None, 10)
        other = store.claim_locked(b, None, 100)
        assert len(held) == 10 and len(other) == 20 and not {m.id for m in held} & {m.id for m in other}
        a.rollback()  # the end of a transaction lease: available again
        b.rollback()
    relay = app.relay(sink, lease="transaction", batch_size=7)
    relay.run(stop_when_empty=True)
    assert all_sent(db, 30) and len(receiver.deliveries()) == 30
    assert all(row(db, r.id)["attempts"] == 1 for r in refs)


def test_relay_options_are_checked(app, sink):
    with pytest.raises(ConfigurationError, match="lease must be one of"):
        app.relay(sink, lease="forever")
    with pytest.raises(ConfigurationError, match="needs lease='transaction'"):
        app.relay(EnqueueJobSink(app), lease="claimed")
    with pytest.raises(ConfigurationError, match="batch_size"):
        app.relay(sink, batch_size=0)
    with pytest.raises(ConfigurationError, match="deliver"):
        app.relay(object())
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        HttpSink("ftp://example.com/x")
    assert DEFAULT_RETRY(1, None) > 0


def test_a_database_error_in_a_pass_is_backed_off_not_fatal_and_raised_as_a_skiplock_error(app, db, caplog):
    """The relay is a lifecycle Loop: a pass the server refuses (here: its table is gone for a while)
    is logged, counted and retried after a backoff -- the relay keeps running -- and what it saw is a
    skiplock DatabaseError (the relay is driver-free), never the driver's own error."""
    import logging

    from skiplock.errors import DatabaseError

    delivered: list[object] = []

    class Collect:
        def deliver(self, message) -> None:
            delivered.append(message.payload)

    ref = app.outbox.put("t", {"n": 1})
    db.execute("ALTER TABLE skiplock.outbox RENAME TO outbox_away")
    relay = app.relay(Collect(), poll_interval=0.05, max_reconnect_delay=0.2, listen=False)
    try:
        with caplog.at_level(logging.WARNING, logger="skiplock.relay"):
            relay.start()
            assert relay.wait_for_failures(2, timeout=30), "the refused passes were not retried"
        assert isinstance(relay.last_error, DatabaseError) and relay.last_error.sqlstate == "42P01"
        assert not relay.stopped.is_set()
        assert [r for r in caplog.records if "pass failed" in r.getMessage() and "outbox" in r.getMessage()]
        db.execute("ALTER TABLE skiplock.outbox_away RENAME TO outbox")
        wait_for(lambda: delivered == [{"n": 1}], 30, "the message once the table is back")
    finally:
        relay.stop()
    assert relay.stopped.is_set() and relay.stats.reconnects >= 2
    assert row(db, ref.id)["state"] == "sent"
