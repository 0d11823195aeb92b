"""Real relay processes (``python -m skiplock relay --webhook ...``) against a real receiver: a relay
SIGKILLed after the receiver applied a message but before the relay marked it sent, and 10,000 messages
end to end through two relays. The receiver applies effects with skiplock.dedup in its own database."""

from __future__ import annotations

import signal
import threading
from collections import Counter

from outbox_receiver import Action
from outbox_support import all_sent, row, states, wait_for


def test_relay_sigkilled_after_delivering_before_marking_sent(dsn, db, app, receiver, spawn):
    refs = app.outbox.put_many([("t", {"i": i}) for i in range(30)])
    victim_message = refs[0].id
    release = threading.Event()
    # The receiver commits the effect of the victim message, then holds its response: the relay has
    # delivered it but cannot have marked it sent. That is when the relay dies.
    receiver.script = lambda r: Action(hold=release) if r.message_id == victim_message and r.attempt == 1 else Action()
    args = ("--webhook", receiver.url, "--timeout", "60", "--lease-seconds", "1", "--batch-size", "10",
            "--concurrency", "4", "--poll-interval", "0.05")
    victim = spawn.relay(dsn, *args)
    try:
        assert receiver.held.wait(30), f"the relay never delivered\n{victim.output()}"
        in_hand = row(db, victim_message)
        assert in_hand["state"] == "delivering" and f":{victim.pid}:" in in_hand["owner"]
        assert receiver.effect_count() >= 1
        victim.signal(signal.SIGKILL)
        assert victim.wait() == -signal.SIGKILL
    finally:
        release.set()
    batch = [m for (m,) in db.execute("SELECT id FROM skiplock.outbox WHERE owner LIKE %s", [f"%:{victim.pid}:%"])]
    assert victim_message in batch

    survivor = spawn.relay(dsn, *args)
    wait_for(lambda: all_sent(db, 30), 30, "every message sent after the crash",
             on_timeout=lambda: f"{states(db)}\n{survivor.output()}")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output()
    assert "returned 10 message(s) with an expired lease to the queue" in survivor.output()

    deliveries = Counter(d.message_id for d in receiver.deliveries())
    assert deliveries[victim_message] == 2, "the message delivered before the crash was not redelivered"
    second_attempts = {d.message_id for d in receiver.deliveries() if d.attempt == 2}
    assert set(batch) <= second_attempts, "the dead relay's whole batch is redelivered (its outcomes were never written)"
    assert set(deliveries) == {r.id for r in refs} and max(deliveries.values()) == 2
    effects = Counter(message_id for _, message_id, _ in receiver.effects())
    assert effects[victim_message] == 1, "the redelivered message had a second effect"
    assert sum(effects.values()) == 30 and set(effects.values()) == {1}
    assert row(db, victim_message)["attempts"] == 2


def test_10000_messages_end_to_end_through_two_relay_processes(dsn, db, app, receiver, spawn):
    n = 10_000
    for start in range(0, n, 2500):
        app.outbox.put_many([("orders.created", {"order": i}) for i in range(start, start + 2500)])
    args = ("--webhook", receiver.url, "--timeout", "60", "--batch-size", "200", "--concurrency", "16", "--poll-interval", "0.05")
    relays = [spawn.relay(dsn, *args) for _ in range(2)]
    wait_for(lambda: all_sent(db, n), 90, f"{n} messages sent", interval=0.2,
             on_timeout=lambda: f"{states(db)}\n" + "\n".join(r.output()[-2000:] for r in relays))
    for r in relays:
        r.signal(signal.SIGTERM)
    for r in relays:
        assert r.wait() == 0, r.output()
    deliveries = Counter(d.message_id for d in receiver.deliveries())
    assert len(deliveries) == n and set(deliveries.values()) == {1}, "a message was delivered twice or never"
    effects = Counter(message_id for _, message_id, _ in receiver.effects())
    assert len(effects) == n and set(effects.values()) == {1}, "duplicate or missing effects"
    sent_by = [int(r.output().split(" stopped: ")[1].split(" sent")[0]) for r in relays]
    assert sum(sent_by) == n and all(sent_by), sent_by
