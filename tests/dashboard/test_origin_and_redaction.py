"""Two ways a page could be abused although every request carries a valid credential: a POST from
another site (the browser adds the session cookie; Origin checking refuses it before the CSRF check
even runs), and an args-text search that answers "does the hidden value contain this?". Each test runs
on each backend (dashboard_backends.py)."""

from __future__ import annotations

from skiplock.dashboard import create_app

from dashboard_backends import backend_dsn, pytest_generate_tests  # noqa: F401 - each backend
from dashboard_support import OPERATOR, VIEWER, client

HTML = {"Accept": "text/html"}


def test_a_cross_origin_post_is_refused_whatever_its_credential(operator, app):
    app.enqueue("send", {}, queue="mail")
    evil = operator.post("/queues/mail/pause", headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "cross-origin" in evil.json()["error"]
    assert operator.post("/queues/mail/pause", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert operator.post("/queues/mail/pause", headers={"Origin": "null"}).status_code == 403
    assert operator.post("/queues/mail/pause", headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
    assert "mail" not in app.read_model.backend.paused_queues()
    # the login form too (login CSRF: being logged in as someone else)
    assert operator.post("/login", data={"token": OPERATOR}, headers={"Origin": "http://evil.example"}).status_code == 403
    # the same origin as the request's Host, or none (a script), is let through to the usual checks
    assert operator.post("/queues/mail/pause", headers={"Origin": "http://testserver"}).status_code == 303
    assert operator.post("/queues/mail/resume").status_code == 303
    # Chromium's form POST from our pages (Referrer-Policy: no-referrer): Origin null, same-origin fetch
    assert operator.post("/queues/mail/pause", headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"}
                         ).status_code == 303
    # reads are never refused for their Origin
    assert operator.get("/queues", headers={"Origin": "http://evil.example"}).status_code == 200


def test_a_trusted_origin_may_post(app):
    app.enqueue("send", {}, queue="mail")
    dash = create_app(app, operator_token=OPERATOR, trusted_origins=["https://ops.example.com/"])
    with client(dash, OPERATOR) as c:
        assert c.post("/queues/mail/pause", headers={"Origin": "https://ops.example.com"}).status_code == 303
        assert c.post("/queues/mail/resume", headers={"Origin": "https://other.example.com"}).status_code == 403


def test_args_search_does_not_reveal_a_redacted_value(app):
    secret = app.enqueue("signup", {"user": "ann", "password": "hunter2"})
    public = app.enqueue("signup", {"user": "hunter2-fan", "password": "x"})
    for redact in ({"signup": ["password"]},
                   lambda task, args: {k: ("***" if k == "password" else v) for k, v in args.items()}):
        dash = create_app(app, token=VIEWER, redact=redact)
        with client(dash, VIEWER) as c:
            found = c.get("/jobs?args=hunter2", headers=HTML).text
            assert f'/jobs/{public}"' in found and f'/jobs/{secret}"' not in found
            assert f'/jobs/{secret}"' in c.get("/jobs?args=ann", headers=HTML).text
    # without redaction the value is searchable as before
    with client(create_app(app, token=VIEWER), VIEWER) as c:
        assert f'/jobs/{secret}"' in c.get("/jobs?args=hunter2", headers=HTML).text
