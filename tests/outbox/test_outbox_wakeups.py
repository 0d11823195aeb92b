"""Wake-ups: every put sends one NOTIFY (channel `skiplock`, payload `outbox:<schema>`) at its commit, and a
running relay LISTENs and claims at once; polling stays the fallback. Deadlines are generous and far below
the relays' poll intervals, so a delivery in time can only have come from a wake-up."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from outbox_support import all_sent, row, states, wait_for

from skiplock.errors import DatabaseUnavailable

LONG_POLL = 120.0  # a relay that only polled would not claim again within any deadline below
DEADLINE = 20.0


def notes_until_marker(listener: psycopg.Connection, marker_dsn: str) -> list[tuple[str, str]]:
    """Every notification on `skiplock` up to a marker NOTIFY sent now: notifications arrive in commit
    order, so whatever an earlier commit sent is in the list."""
    with psycopg.connect(marker_dsn, autocommit=True) as c:
        c.execute("SELECT pg_notify('skiplock', 'test-marker')")
    out: list[tuple[str, str]] = []
    for note in listener.notifies(timeout=DEADLINE):
        if note.payload == "test-marker":
            return out
        out.append((note.channel, note.payload))
    raise AssertionError(f"the marker notification did not arrive within {DEADLINE}s (got {out})")


LISTENERS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND application_name = 'skiplock-listener' AND query LIKE 'LISTEN skiplock%'")


def listener_pids(db) -> list[int]:
    """Backends of this database that have run LISTEN skiplock (the relay's listener)."""
    return [r[0] for r in db.execute(LISTENERS).fetchall()]


def kill_listeners(db) -> list[int]:
    pids = listener_pids(db)
    db.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
    return pids


def test_put_notifies_once_per_committing_transaction_and_never_on_rollback(app, dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN skiplock")
        with psycopg.connect(dsn) as conn:
            app.outbox.put("t", {"n": 1}, conn=conn)
            conn.rollback()
        assert notes_until_marker(listener, dsn) == [], "a rolled-back put notified"

        with psycopg.connect(dsn) as conn:
            app.outbox.put("t", {"n": 2}, conn=conn)
            app.outbox.put_many([("t", {"n": 3}), ("t", {"n": 4}, "k")], conn=conn)
            app.outbox.put("t", {"n": 5}, key="k", conn=conn)
            assert notes_until_marker(listener, dsn) == [], "notified before the commit"
            conn.commit()
        assert notes_until_marker(listener, dsn) == [("skiplock", "outbox:skiplock")]

        app.outbox.put("t", {"n": 6})  # on skiplock's own connection: its own transaction
        assert notes_until_marker(listener, dsn) == [("skiplock", "outbox:skiplock")]

        async def put_async() -> None:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                await app.outbox.put_async("t", {"n": 7}, conn=conn)
                await conn.commit()

        asyncio.run(put_async())
        assert notes_until_marker(listener, dsn) == [("skiplock", "outbox:skiplock")]

        app.outbox.notify = False
        app.outbox.put("t", {"n": 8})
        app.outbox.put_many([("t", {"n": 9})])
        assert notes_until_marker(listener, dsn) == []


def test_idle_relay_wakes_on_a_put_long_before_its_poll_interval(app, dsn, db, receiver, sink):
    relay = app.relay(sink, poll_interval=LONG_POLL).start()
    try:
        wait_for(lambda: relay.listener is not None and relay.listener.listening.is_set() and relay.idle.is_set(),
                 DEADLINE, "the relay to be idle and listening")
        ref = app.outbox.put("t", {"n": 1})
        wait_for(lambda: row(db, ref.id)["state"] == "sent", DEADLINE, "the message to be delivered after a wake-up")
        # and again, through put_many on the caller's connection
        with psycopg.connect(dsn) as conn:
            refs = app.outbox.put_many([("t", {"n": i}) for i in range(3)], conn=conn)
            conn.commit()
        wait_for(lambda: all(row(db, r.id)["state"] == "sent" for r in refs), DEADLINE, "put_many to be delivered")
        assert relay.listener.notifications >= 2
    finally:
        relay.stop()
    assert receiver.effect_count() == 4


def test_killed_listener_connection_reconnects_and_the_relay_still_wakes(app, db, receiver, sink):
    relay = app.relay(sink, poll_interval=LONG_POLL).start()
    try:
        wait_for(lambda: relay.listener is not None and relay.listener.listening.is_set(), DEADLINE,
                 "the listener to be up")
        killed = kill_listeners(db)
        assert len(killed) == 1
        wait_for(lambda: relay.listener.reconnects >= 1, DEADLINE, "the listener to notice")
        wait_for(lambda: [p for p in listener_pids(db) if p not in killed], DEADLINE, "the listener to LISTEN again")
        for n in range(2):  # the first may be found by the claim every reconnect makes; the second cannot
            ref = app.outbox.put("t", {"after": "reconnect", "n": n})
            wait_for(lambda: row(db, ref.id)["state"] == "sent", DEADLINE,
                     "the message put after the reconnect to be delivered", on_timeout=lambda: str(states(db)))
        assert relay.listener.notifications >= 1
    finally:
        relay.stop()


def test_a_message_put_while_the_listener_is_down_is_found_when_it_reconnects(app, db, receiver, sink):
    store = app.outbox.store
    real_connect = store.connect_listener
    allowed = threading.Event()
    allowed.set()

    def connect_listener():
        if not allowed.is_set():
            raise DatabaseUnavailable("test: the listener is kept out")
        return real_connect()

    store.connect_listener = connect_listener  # what the relay's listener connects with
    relay = app.relay(sink, poll_interval=LONG_POLL, max_reconnect_delay=0.5).start()
    try:
        wait_for(lambda: relay.listener is not None and relay.listener.listening.is_set() and relay.idle.is_set(),
                 DEADLINE, "the relay to be idle and listening")
        allowed.clear()
        assert len(kill_listeners(db)) == 1
        wait_for(lambda: relay.listener.reconnects >= 2, DEADLINE, "a reconnect attempt to fail")
        ref = app.outbox.put("t", {"while": "down"})  # its notification reaches nobody: lost for good
        allowed.set()
        wait_for(lambda: row(db, ref.id)["state"] == "sent", DEADLINE,
                 "the message to be found by the claim after the reconnect")
        assert relay.listener.notifications == 0
    finally:
        allowed.set()
        relay.stop()


@pytest.mark.parametrize("listen", [True, False])
def test_without_a_notification_polling_still_delivers(app, db, receiver, sink, listen):
    app.outbox.notify = False  # as if every NOTIFY were lost
    relay = app.relay(sink, poll_interval=0.2, listen=listen).start()
    try:
        wait_for(lambda: relay.idle.is_set(), DEADLINE, "the relay to be idle")
        refs = [app.outbox.put("t", {"n": i}) for i in range(3)]
        wait_for(lambda: all_sent(db, 3), DEADLINE, "polling to deliver", on_timeout=lambda: str(states(db)))
        assert [r.id for r in refs] == sorted(d.message_id for d in receiver.deliveries())
        if listen:
            assert relay.listener is not None and relay.listener.notifications == 0
        else:
            assert relay.listener is None
    finally:
        relay.stop()
