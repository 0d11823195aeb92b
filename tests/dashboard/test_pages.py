"""What each operator page shows, with real data from real workers on the test database (issue 13
§1's list, page by page): running now (lease mode, lease expiry, cancel), workers (busy slots, a
stale one flagged), queues (flow-control limits), cron (last and next fire), outbox (pending,
failed, redrive). Driven in-process as in test_web.py, on each backend (dashboard_backends.py)."""

from __future__ import annotations

import html as html_lib
import re
import threading
from datetime import datetime, timedelta, timezone

import pytest

import skiplock
from skiplock.maintenance.periodic import Scheduler
from skiplock.worker.presence import Presence

from dashboard_backends import backend_dsn, pytest_generate_tests, run_sql  # noqa: F401 - each backend
from support import wait_for


# Seconds between the polls of a read that shows transaction-lease jobs in flight. On MariaDB that read
# asks INNODB_TRX, a server-wide cache InnoDB refreshes only once nobody has read it for 0.1 s: polled
# faster (by this test, or with the other test processes' reads) it never shows a new transaction.
IN_FLIGHT_POLL = 0.25


def text_of(page: str) -> str:
    """A page's text, tags removed and entities decoded (for reading a table's cells)."""
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", page))


def row_of(page: str, marker: str) -> str:
    """The text of the table row of ``page`` whose HTML contains ``marker``."""
    for row in re.findall(r"<tr.*?</tr>", page, flags=re.S):
        if marker in row:
            return " ".join(text_of(row).split())
    raise AssertionError(f"no row with {marker!r} in the page")


@pytest.fixture
def held(app: skiplock.App, tmp_path):
    """A worker thread (2 slots) and a way to start a job that runs until released."""
    gate = threading.Event()

    @app.task(name="hold_tx")
    def hold_tx(job):
        gate.wait(60)

    @app.task(name="hold_claimed", lease="claimed", lease_seconds=120)
    def hold_claimed(job):
        gate.wait(60)

    worker = app.worker(concurrency=2, poll_interval=0.05, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        gate.set()
        worker.stop()
        thread.join(30)


def test_running_now_shows_each_lease_its_expiry_and_cancels(held, app, operator):
    tx = app.enqueue("hold_tx")
    claimed = app.enqueue("hold_claimed")
    wait_for(lambda: {r.job_id for r in app.read_model.running_now().items} == {tx, claimed}, 30, "both jobs running",
             interval=IN_FLIGHT_POLL)
    page = operator.get("/running").text
    tx_row, claimed_row = row_of(page, f'/jobs/{tx}"'), row_of(page, f'/jobs/{claimed}"')
    assert "transaction" in tx_row and "hold_tx" in tx_row and "1/" in tx_row
    # a claimed lease says when it expires (lease_seconds from its start), and that it has not
    running = {r.job_id: r for r in app.read_model.running_now().items}
    expires = running[claimed].lease_expires_at
    assert expires is not None and expires > datetime.now(timezone.utc)
    assert "claimed" in claimed_row and expires.strftime("%Y-%m-%d %H:%M:%S UTC") in claimed_row
    assert "expired" not in claimed_row
    assert held.name in tx_row  # which worker runs it
    # cancel from the Running page: the job ends cancelled, the page goes back to /running, audited
    r = operator.post(f"/jobs/{claimed}/cancel", data={"back": "/running"})
    assert r.status_code == 303 and r.headers["location"].startswith("/running")
    wait_for(lambda: app.get_job(claimed).state == "cancelled", 30, "the claimed job cancelled", interval=IN_FLIGHT_POLL)
    entry = app.read_model.audit_log().items[0]
    assert entry.action == "cancel" and entry.target == {"job_id": claimed}


def test_workers_page_shows_busy_slots_and_flags_a_stale_worker(held, app, viewer, dsn):
    app.enqueue("hold_tx")
    wait_for(lambda: any(w.running == 1 for w in app.read_model.workers().items), 30, "the worker's slot busy",
             interval=IN_FLIGHT_POLL)
    # a second worker's row, last refreshed 25 s ago (no heartbeat for two intervals: stale, still listed)
    ghost = Presence(app.read_model.backend, "ghost-worker", ["x"], ["mail"], concurrency=4)
    ghost.step()
    run_sql(dsn, "UPDATE skiplock.workers SET last_seen = now() - interval '25 seconds' WHERE id = %s",
            "UPDATE skiplock_workers SET last_seen = UTC_TIMESTAMP(6) - INTERVAL 25 SECOND WHERE id = %s",
            (str(ghost.id),))
    page = viewer.get("/workers").text
    live, stale = row_of(page, f"<td>{held.name}</td>"), row_of(page, "<td>ghost-worker</td>")
    # name, host, pid, queues, concurrency, busy, ...
    assert f" 2 1 " in f" {live} " and "all" in live and "stale" not in live, live
    assert "mail 4 0 " in stale and stale.endswith("stale"), stale
    assert 'class="stale"' in page


def test_queues_page_shows_flow_control_limits(app, viewer):
    app.enqueue("anything", queue="mail")
    app.set_queue_limits("mail", concurrency=3, rate="100/min", fair=True)
    app.set_queue_limits("reports", concurrency=1, rate=None, fair=False)  # limited, no job: listed too
    page = viewer.get("/queues").text
    assert re.search(r'id="limits-mail">concurrency 3, 100/min, fair<', page), page
    assert re.search(r'id="limits-reports">concurrency 1<', page), page
    app.set_queue_limits("mail", concurrency=None, rate=None, fair=False)
    assert re.search(r'id="limits-mail"><', viewer.get("/queues?fragment=1").text)


def test_cron_page_shows_last_and_next_fire(app, viewer):
    @app.periodic("*/5 * * * *", name="five_minutely")
    def five_minutely(job):
        pass

    page = viewer.get("/cron").text
    row = row_of(page, "five_minutely")
    assert "*/5 * * * *" in row and "UTC" in row
    nxt = app.schedules["five_minutely"].next_after(datetime.now(timezone.utc))
    assert nxt.strftime("%Y-%m-%d %H:%M:%S UTC") in row and "in " in row  # next fire, and how soon
    assert app.read_model.last_fire("five_minutely") is None
    # the worker's scheduler, started 10 minutes ago, fires the latest tick due; the page says when
    now = datetime.now(timezone.utc)
    scheduler = Scheduler(app)
    scheduler.catch_up(now - timedelta(minutes=10))
    assert scheduler.run_due(now)
    last = app.read_model.last_fire("five_minutely")
    assert last == app.schedules["five_minutely"].latest_at_or_before(now)
    assert last.strftime("%Y-%m-%d %H:%M:%S UTC") in row_of(viewer.get("/cron").text, "five_minutely")


def test_outbox_page_shows_pending_and_failed_and_redrives(app, operator):
    class Refuses:
        def deliver(self, message):
            if message.payload["n"] == 1:
                raise RuntimeError("receiver down for n=1")

    ids = [app.outbox.put("orders", {"n": n}, max_attempts=1).id for n in range(3)]
    page = operator.get("/outbox").text
    assert "orders pending 3" in " ".join(text_of(page).split())
    assert all(f"<td>{i}</td>" in page for i in ids)  # the pending list
    app.relay(Refuses(), listen=False).run(stop_when_empty=True)
    page = operator.get("/outbox").text
    failed_row = row_of(page, f'name="id" value="{ids[1]}"')
    assert "orders" in failed_row and "receiver down for n=1" in failed_row and "1/1" in failed_row
    assert "Redrive every failed message" in page
    r = operator.post("/outbox/redrive", data={"id": str(ids[1])})
    assert r.status_code == 303 and r.headers["location"].startswith("/outbox")
    assert app.outbox.get(ids[1]).state == "pending"
    assert app.outbox.failed() == []
    entry = app.read_model.audit_log().items[0]
    assert entry.action == "outbox redrive" and entry.affected == 1
    # a viewer sees the failed list but no redrive button
    app.relay(Refuses(), listen=False).run(stop_when_empty=True)
    from skiplock.dashboard import create_app
    from dashboard_support import VIEWER, client

    with client(create_app(app, token=VIEWER), VIEWER) as c:
        page = c.get("/outbox").text
    assert "receiver down for n=1" in page and "Redrive" not in page


def test_job_page_shows_each_attempt_with_its_worker_traceback_and_a_timeline(app, viewer):
    @app.task(name="twice", max_attempts=2, retry=0)
    def twice(job):
        raise LookupError(f"no row for attempt {job.attempt}")

    job_id = app.enqueue("twice")
    app.worker(concurrency=1, handle_signals=False, name="audit-worker").run(stop_when_empty=True)
    app.worker(concurrency=1, handle_signals=False, name="audit-worker").run(stop_when_empty=True)
    assert app.get_job(job_id).state == "failed"
    page = viewer.get(f"/jobs/{job_id}").text
    attempts = [" ".join(text_of(li).split()) for li in re.findall(r"<li><strong>attempt.*?</li>", page, flags=re.S)]
    assert len(attempts) == 2, attempts
    for n, attempt in enumerate(attempts, 1):
        assert f"attempt {n}" in attempt and " on audit-worker/" in attempt, attempt  # which worker (and slot)
        assert "Traceback (most recent call last)" in attempt and f"LookupError: no row for attempt {n}" in attempt
        assert re.search(r"ran \d+ ms", attempt), attempt  # how long it ran
    timeline = text_of(page.split("Timeline", 1)[1])
    for event in ("enqueued", "due", "attempt 1 failed", "attempt 2 failed", "finished: failed"):
        assert event in timeline, (event, timeline)
