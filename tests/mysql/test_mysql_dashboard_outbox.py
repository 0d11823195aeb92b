"""The dashboard's outbox page over the MySQL backend (the private MariaDB), driven in-process through
Starlette's TestClient: counts, dead letters with their error, pending messages; an operator's
redrive puts a dead letter back to pending and writes its audit row (migration 5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import skiplock
from skiplock.backend.outbox_base import Finish
from skiplock.dashboard import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dashboard"))
from dashboard_support import OPERATOR, VIEWER, client  # noqa: E402


@pytest.fixture
def app(mariadb_dsn: str) -> Iterator[skiplock.App]:
    a = skiplock.App(mariadb_dsn)
    a.migrate()
    yield a
    a.close()


def test_the_outbox_page_shows_counts_dead_letters_and_pending_messages(app: skiplock.App) -> None:
    dead, waiting = app.outbox.put_many([("orders.created", {"n": 1}), ("orders.paid", {"n": 2}, "customer-7")])
    store = app.outbox.store
    claimed, _ = store.claim_lease("test-relay/1", ["orders.created"], 1, 30)
    assert [m.id for m in claimed] == [dead.id]
    store.finish_lease("test-relay/1", [Finish(dead.id, "failed", error="permanent failure: HTTP 422 <unknown>")])
    dash = create_app(app, token=VIEWER, operator_token=OPERATOR)
    with client(dash, VIEWER) as c:
        page = c.get("/outbox")
    assert page.status_code == 200, page.text
    html = page.text
    assert "orders.created" in html and "orders.paid" in html and "customer-7" in html
    assert "permanent failure: HTTP 422 &lt;unknown&gt;" in html  # escaped
    assert "The outbox is empty" not in html and "Redrive every failed message" not in html  # read-only token
    assert app.outbox.get(waiting.id).state == "pending"


def test_an_operator_redrives_a_dead_letter_from_the_page(app: skiplock.App) -> None:
    ref = app.outbox.put("orders.created", {"n": 1}, max_attempts=1)
    store = app.outbox.store
    store.claim_lease("test-relay/1", None, 1, 30)
    store.finish_lease("test-relay/1", [Finish(ref.id, "failed", error="gave up")])
    dash = create_app(app, token=VIEWER, operator_token=OPERATOR)
    with client(dash, OPERATOR) as c:
        page = c.get("/outbox")
        assert "Redrive every failed message" in page.text
        done = c.post("/outbox/redrive", data={"id": str(ref.id)})
    assert done.status_code == 303 and "1%20message" in done.headers["location"], (done.status_code, done.text)
    assert app.outbox.get(ref.id).state == "pending"
    entry = app.read_model.audit_log().items[0]  # the action is audited, as on PostgreSQL
    assert (entry.action, entry.target, entry.affected) == ("outbox redrive", {"ids": [ref.id]}, 1)
    assert entry.actor.startswith("operator") and entry.at.tzinfo is not None
