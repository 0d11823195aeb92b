"""The dashboard over a real database, driven in-process (httpx through Starlette's TestClient):
closed by default, roles, CSRF, the audit log, every page with data, keyset pages, bulk actions.
Every test runs on each backend (dashboard_backends.py): ``test_x[postgres]``, ``test_x[mariadb]``."""

from __future__ import annotations

import re

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import skiplock
from skiplock.dashboard import create_app
from skiplock.dashboard.auth import COOKIE

from dashboard_backends import backend_dsn, password_of, pytest_generate_tests  # noqa: F401 - each backend
from dashboard_support import OPERATOR, VIEWER, client

PAGES = ["/", "/jobs", "/running", "/workers", "/queues", "/cron", "/outbox", "/audit"]


def fail_some(app: skiplock.App, n: int, queue: str = "default") -> list[int]:
    """n jobs that end failed (one attempt each), via a real worker."""
    @app.task(name="boom", queue=queue, max_attempts=1)
    def boom(job, **_):
        raise ValueError("boom")

    @app.task(name="ok", queue=queue)
    def ok(job, **_):
        return {"fine": True}

    ids = app.enqueue_many([("boom", {"n": i, "secret": "hunter2"}) for i in range(n)])
    app.worker(queues=[queue], concurrency=2).run(stop_when_empty=True)
    return ids


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def login(c, token: str) -> None:
    r = c.post("/login", data={"token": token, "next": "/jobs"})
    assert r.status_code == 303 and r.headers["location"] == "/jobs"
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()


# ---- closed by default -------------------------------------------------------------------------

@pytest.mark.parametrize("path", PAGES + ["/jobs/1", "/api/overview"])
def test_unauthenticated_gets_no_data(anonymous, path):
    html = anonymous.get(path, headers={"Accept": "text/html"})
    api = anonymous.get(path, headers={"Accept": "application/json"})
    if path.startswith("/api/"):
        assert html.status_code == 401
    else:
        assert html.status_code == 303 and html.headers["location"].startswith("/login?next=")
    assert api.status_code == 401 and api.headers["www-authenticate"].startswith("Bearer")


def test_wrong_bearer_and_forged_cookie_are_refused(dash):
    with client(dash, "x" * 32) as c:
        assert c.get("/api/overview").status_code == 401
    with client(dash) as c:
        c.cookies.set(COOKIE, "eyJyIjoib3BlcmF0b3IiLCJlIjo5OTk5OTk5OTk5LCJuIjoieCJ9.AAAA")
        assert c.get("/api/overview").status_code == 401


def test_a_dashboard_needs_a_token(app):
    with pytest.raises(ValueError, match="no open mode"):
        create_app(app)


def test_bearer_reads_every_page(viewer, app):
    fail_some(app, 2)
    for path in PAGES:
        r = viewer.get(path)
        assert r.status_code == 200, path
        assert "content-security-policy" in r.headers
    assert viewer.get("/api/overview").json()["counts"]


def test_login_cookie_then_pages_and_logout(dash):
    with client(dash) as c:
        assert c.post("/login", data={"token": "wrong" * 5}).status_code == 401
        login(c, VIEWER)
        assert c.get("/jobs").status_code == 200
        r = c.post("/logout")
        assert r.status_code == 303
        c.cookies.clear()
        assert c.get("/jobs", headers={"Accept": "application/json"}).status_code == 401


def test_login_url_sets_the_cookie(dash):
    with client(dash) as c:
        r = c.get(f"/login?token={OPERATOR}")
        assert r.status_code == 303 and "Log out" not in r.text
        assert c.get("/queues").status_code == 200


def test_open_redirect_refused(dash):
    with client(dash) as c:
        r = c.post("/login", data={"token": VIEWER, "next": "//evil.example/"})
        assert r.headers["location"] == "/"


# ---- roles, CSRF, audit --------------------------------------------------------------------------

def test_viewer_cannot_act(viewer, app):
    ids = fail_some(app, 1)
    r = viewer.post(f"/jobs/{ids[0]}/retry")
    assert r.status_code == 403
    assert app.get_job(ids[0]).state == "failed"
    assert "Retry" not in viewer.get(f"/jobs/{ids[0]}").text


def test_cookie_action_needs_the_csrf_token(dash, app):
    ids = fail_some(app, 1)
    with client(dash) as c:
        login(c, OPERATOR)
        assert c.post(f"/jobs/{ids[0]}/retry").status_code == 403
        assert c.post(f"/jobs/{ids[0]}/retry", data={"csrf": "nope"}).status_code == 403
        assert app.get_job(ids[0]).state == "failed"
        token = csrf_of(c.get(f"/jobs/{ids[0]}").text)
        r = c.post(f"/jobs/{ids[0]}/retry", data={"csrf": token})
        assert r.status_code == 303
    assert app.get_job(ids[0]).state == "queued"
    entry = app.read_model.audit_log().items[0]
    assert entry.action == "retry" and entry.actor.startswith("operator (session") and entry.affected == 1
    assert entry.target == {"job_id": ids[0]}


def test_a_queue_name_with_a_slash_can_be_paused(operator, app):
    @app.task(name="t", queue="team/a")
    def t(job):
        pass

    app.enqueue("t", {})
    assert operator.post("/queues/team/a/pause").status_code == 303
    assert app.read_model.backend.paused_queues() == ["team/a"]


def test_pause_resume_audited_and_shown(operator, app):
    fail_some(app, 1, queue="mail")
    assert operator.post("/queues/mail/pause").status_code == 303
    assert "mail" in app.read_model.backend.paused_queues()
    assert 'id="paused-mail">paused' in operator.get("/queues").text
    assert operator.post("/queues/mail/resume").status_code == 303
    assert "mail" not in app.read_model.backend.paused_queues()
    audit = operator.get("/audit").text
    assert "pause" in audit and "resume" in audit and "operator (bearer" in audit


# ---- pages -------------------------------------------------------------------------------------

def test_job_page_redacts_args_per_task(app):
    ids = fail_some(app, 1)
    dash = create_app(app, token=VIEWER, redact={"boom": ["secret"]})
    with client(dash, VIEWER) as c:
        html = c.get(f"/jobs/{ids[0]}").text
    assert "hunter2" not in html and "[redacted]" in html
    assert "ValueError: boom" in html and "attempt 1" in html and "Timeline" in html


def test_jobs_filters(viewer, app):
    ids = fail_some(app, 3)
    done = app.enqueue("ok", {"who": "Zed"})
    app.worker(concurrency=1).run(stop_when_empty=True)
    assert f'/jobs/{done}"' in viewer.get("/jobs?args=zed").text
    failed_html = viewer.get("/jobs?state=failed&error_class=ValueError").text
    assert all(f'/jobs/{i}"' in failed_html for i in ids) and f'/jobs/{done}"' not in failed_html
    assert f'/jobs/{ids[0]}"' not in viewer.get("/jobs?state=failed&task=ok").text
    assert viewer.get("/jobs?since=not-a-date").status_code == 400


def test_jobs_keyset_pages_cover_every_job_once(viewer, app):
    @app.task(name="t")
    def t(job):
        pass

    ids = app.enqueue_many([("t", {}) for _ in range(7)])
    seen: list[int] = []
    url = "/jobs?limit=3"
    while url:
        html = viewer.get(url).text
        seen += [int(x) for x in re.findall(r'href="/jobs/(\d+)"', html)]
        nxt = re.search(r'rel="next" href="([^"]+)"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
        if len(seen) == 3:
            app.enqueue("t", {})  # a newer job does not shift the pages
    assert seen == sorted(ids, reverse=True)


def test_bulk_retry_confirms_the_count_then_retries(operator, app):
    ids = fail_some(app, 5)
    r = operator.post("/jobs/bulk", data={"action": "retry", "state": "failed", "task": "boom"})
    assert r.status_code == 200 and "<strong>5</strong>" in r.text
    assert all(app.get_job(i).state == "failed" for i in ids)  # nothing touched before confirming
    r = operator.post("/jobs/bulk", data={"action": "retry", "state": "failed", "task": "boom", "confirm": "yes"})
    assert r.status_code == 303
    assert all(app.get_job(i).state == "queued" for i in ids)
    entry = app.read_model.audit_log().items[0]
    assert entry.action == "bulk retry" and entry.affected == 5
    assert entry.target["filter"] == {"state": "failed", "task": "boom"}


def test_bulk_needs_a_state_its_action_applies_to(operator, app):
    fail_some(app, 1)
    assert operator.post("/jobs/bulk", data={"action": "retry", "state": "done"}).status_code == 400
    assert operator.post("/jobs/bulk", data={"action": "delete", "state": "queued"}).status_code == 400


def test_bulk_delete_and_cancel(operator, app):
    ids = fail_some(app, 2)
    later = app.enqueue("ok", {}, delay=3600)
    operator.post("/jobs/bulk", data={"action": "delete", "state": "failed", "confirm": "yes"})
    assert all(app.read_model.backend.get_job(i) is None for i in ids)
    operator.post("/jobs/bulk", data={"action": "cancel", "state": "queued", "confirm": "yes"})
    assert app.get_job(later).state == "cancelled"


def test_no_secret_in_any_page(dsn, app):
    fail_some(app, 1)
    dash = create_app(app, token=VIEWER, operator_token=OPERATOR)
    password = password_of(dsn)  # the private MariaDB's user has one; the embedded PostgreSQL's none
    with client(dash, OPERATOR) as c:
        for path in PAGES + ["/jobs/1"]:
            html = c.get(path).text
            assert dsn not in html and VIEWER not in html and OPERATOR not in html
            if password:
                assert password not in html


# ---- mounting ----------------------------------------------------------------------------------

def test_mounted_in_a_starlette_app_with_extra_routes(app):
    def metrics(request):
        return PlainTextResponse("skiplock_up 1\n")

    dash = create_app(app, token=VIEWER, routes=[Route("/metrics", metrics)])
    outer = Starlette(routes=[Route("/", lambda r: PlainTextResponse("host app")), Mount("/ops/skiplock", dash)])
    with client(outer) as c:
        assert c.get("/").text == "host app"
        r = c.get("/ops/skiplock/jobs", headers={"Accept": "text/html"})
        assert r.status_code == 303 and r.headers["location"].startswith("/ops/skiplock/login")
        assert c.get("/ops/skiplock/metrics").status_code == 401
        r = c.post("/ops/skiplock/login", data={"token": VIEWER, "next": "/queues"})
        assert r.headers["location"] == "/ops/skiplock/queues"
        assert "path=/ops/skiplock" in r.headers["set-cookie"].lower()
        page = c.get("/ops/skiplock/queues").text
        assert 'href="/ops/skiplock/static/dashboard.css"' in page
        assert c.get("/ops/skiplock/metrics").text == "skiplock_up 1\n"
        assert c.get("/ops/skiplock/static/dashboard.js").status_code == 200


def test_mounted_by_a_plain_asgi_dispatcher_as_in_the_django_recipe(app):
    """docs/dashboard.md's Django asgi.py: a prefix routed to the dashboard with root_path set."""
    dash = create_app(app, token=VIEWER)
    other = Starlette(routes=[Route("/admin/", lambda request: PlainTextResponse("django"))])  # Django's stand-in

    async def application(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/ops/skiplock"):
            scope = dict(scope, root_path=scope.get("root_path", "") + "/ops/skiplock")
            return await dash(scope, receive, send)
        return await other(scope, receive, send)

    with client(application) as c:
        assert c.get("/admin/").text == "django"
        assert c.get("/ops/skiplock/queues", headers={"Accept": "text/html"}).headers["location"].startswith(
            "/ops/skiplock/login")
    with client(application, VIEWER) as c:
        page = c.get("/ops/skiplock/jobs")
        assert page.status_code == 200 and 'action="/ops/skiplock/jobs"' in page.text


def test_the_queues_page_shows_each_queues_limits(viewer, app):
    app.set_queue_limits("api", concurrency=5, rate="100/min")
    app.set_queue_limits("tenants", fair=True, weights={"<b>big</b>": 3})
    app.enqueue("t", {}, queue="plain", sequence="s")
    app.enqueue("t", {}, queue="plain", sequence="s")  # blocked behind the first
    page = viewer.get("/queues").text
    cells = dict(re.findall(r'<a href="[^"]*">([^<]+)</a></td>.*?<td class="limits"[^>]*>([^<]*)</td>', page, re.S))
    assert cells == {"api": "concurrency 5, 100/min", "plain": "", "tenants": "fair (&lt;b&gt;big&lt;/b&gt;=3)"}
    summary = {q.queue: q for q in app.read_model.queue_summary()}
    assert summary["plain"].counts["blocked"].n == 1 and summary["plain"].limits is None
    assert str(summary["api"].limits) == "concurrency 5, 100/min"
    api = {q["queue"]: q["limits"] for q in viewer.get("/api/overview").json()["queues"]}
    assert api["tenants"] == {"concurrency": None, "rate": None, "fair": True, "weights": {"<b>big</b>": 3}}
    assert api["plain"] is None
