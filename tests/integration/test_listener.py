"""The listening session behind the seam and the Listener loop on it, against a real PostgreSQL:
``connect_listener()`` gives the port's Notifications (payloads, only skiplock errors -- a killed
session raises ConnectionLost, never the driver's error), and the Listener, a lifecycle Loop,
reconnects after its session is killed, wakes every slot once, and reports through its events."""

from __future__ import annotations

import threading

import pytest

from skiplock.errors import ConnectionLost, DatabaseUnavailable
from skiplock.worker.listener import Listener
from support import wait_for

LISTENERS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND application_name = 'skiplock-listener'")


def kill_listeners(db) -> list[int]:
    pids = [r[0] for r in db.execute(LISTENERS).fetchall()]
    for pid in pids:
        db.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
    return pids


def test_notifications_are_payloads_and_a_killed_session_raises_connection_lost(app, db):
    backend = app.backend
    notes = backend.connect_listener()
    try:
        assert notes.wait(0) == []
        db.execute("SELECT pg_notify('skiplock', 'hello')")
        assert wait_for(lambda: notes.wait(0.5), 10, "the notification") == ["hello"]
        assert len(kill_listeners(db)) == 1
        with pytest.raises(ConnectionLost, match="lost the LISTEN connection"):
            for _ in range(40):  # the death shows on the next read; a safety net, not a speed bar
                notes.wait(0.25)
    finally:
        notes.close()


def test_the_listener_reconnects_after_its_session_is_killed_and_wakes_every_slot(app, db):
    backend = app.backend
    wakes: list[bool] = []
    woken = threading.Condition()

    def wake(every: bool) -> None:
        with woken:
            wakes.append(every)
            woken.notify_all()

    stopping = threading.Event()
    listener = Listener(backend.connect_listener, backend.wake_payload, wake, stopping, max_backoff=0.2).start()
    try:
        wait_for(lambda: listener.listening.is_set(), 30, "the listener to be up")
        assert listener.started.is_set() and wakes == [True]  # every slot, once, after connecting
        db.execute("SELECT pg_notify('skiplock', %s)", [backend.wake_payload])
        db.execute("SELECT pg_notify('skiplock', 'someone else')")
        wait_for(lambda: listener.notifications == 1, 30, "the notification")
        killed = kill_listeners(db)
        assert listener.wait_for_failures(1, timeout=30), "the listener never noticed its session was killed"
        assert isinstance(listener.last_error, DatabaseUnavailable)
        wait_for(lambda: [p for p in (r[0] for r in db.execute(LISTENERS)) if p not in killed], 30,
                 "the listener to LISTEN again")
        wait_for(lambda: wakes.count(True) == 2, 30, "every slot woken after the reconnect")
        assert listener.reconnects == 1 and wakes == [True, False, True]
    finally:
        stopping.set()  # the owner's event stops it
        listener.stop()
    assert listener.stopped.is_set() and not listener.listening.is_set()
