"""Live updates by server-sent events: GET /events/<page> streams the page's live region whenever it
changed (the pages' script falls back to polling the fragment; tests/dashboard/test_browser.py
watches a running job appear and finish through it in a real browser)."""

from __future__ import annotations

from skiplock.dashboard import create_app, web

from dashboard_support import VIEWER, client


def events(text: str) -> list[tuple[str, str]]:
    """(event name, data) of each event of an SSE body; comments as ("comment", text)."""
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line]
        if not lines:
            continue
        if all(line.startswith(":") for line in lines):
            out.append(("comment", lines[0][1:].strip()))
            continue
        name = next((line[7:] for line in lines if line.startswith("event: ")), "message")
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        if any(line.startswith(("event: ", "data: ")) for line in lines):
            out.append((name, data))
    return out


def test_a_live_page_streams_its_region_when_it_changes(app, monkeypatch):
    monkeypatch.setattr(web, "SSE_SECONDS", 1.0)  # a stream ends (and the browser reconnects) after this
    app.enqueue("send", {}, queue="mail")
    dash = create_app(app, token=VIEWER, poll_seconds=0.2)
    with client(dash, VIEWER) as c:
        r = c.get("/events/queues")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.text.startswith("retry: 200\n")  # the browser's reconnection delay: the poll interval
        updates = [data for name, data in events(r.text) if name == "update"]
        assert updates and all('id="paused-mail">no<' in u for u in updates)
        # a region that did not change is not sent again (the workers page without workers)
        got = events(c.get("/events/workers").text)
        assert [name for name, _ in got].count("update") == 1 and ("comment", "unchanged") in got
        app.pause_queue("mail")
        updates = [data for name, data in events(c.get("/events/queues").text) if name == "update"]
        assert updates and 'id="paused-mail">paused<' in updates[0]
        assert c.get("/events/nosuch").status_code == 404
    with client(dash) as anonymous:
        assert anonymous.get("/events/queues").status_code == 401


def test_every_live_page_has_a_stream_and_a_polling_fallback(viewer):
    for page, path in (("overview", "/"), ("running", "/running"), ("workers", "/workers"), ("queues", "/queues")):
        html = viewer.get(path, headers={"Accept": "text/html"}).text
        assert f'data-events="/events/{page}"' in html and "fragment=1" in html
