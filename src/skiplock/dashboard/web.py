"""The dashboard's routes, the authentication middleware and the pages (see docs/dashboard.md).

Endpoints that read are plain ``def`` functions (Starlette runs them in its thread pool: the App's
calls are synchronous); actions are ``async`` only to read their form, and call the App in the
thread pool too. Every action: operator role, CSRF token for a cookie session, then one audit row.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import DuplicateJob, InvalidJob, JobNotFound, SkiplockError
from ..job import JobState
from ..readmodel import JobFilter, all_pages
from .auth import COOKIE, Auth, Identity

HERE = resources.files(__package__)
PUBLIC = ("/login", "/static/")
FINISHED_STATES = ("done", "failed", "cancelled")
# Which states a bulk action applies to (the filter's state must be one of them: the confirmation's
# count is then exactly the rows it touches).
BULK_STATES = {"retry": ("failed", "cancelled"), "cancel": ("queued", "running"), "delete": FINISHED_STATES}


def _route_path(scope: Mapping[str, Any]) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class AuthMiddleware:
    """Closed by default: every path but the login page and static files needs an identity (see
    auth.py); without one, 401 for what does not ask for HTML, else a redirect to the login page."""

    def __init__(self, asgi: Any, auth: Auth):
        self.asgi, self.auth = asgi, auth

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.asgi(scope, receive, send)
            return
        path = _route_path(scope)
        request = Request(scope)
        identity = self.auth.identify(request.headers, request.cookies)
        scope["skiplock.identity"] = identity
        if identity is None and not any(path == p or path.startswith(p) for p in PUBLIC):
            wants_html = "text/html" in request.headers.get("accept", "") and not path.startswith("/api/")
            if wants_html and request.method in ("GET", "HEAD") and "authorization" not in request.headers:
                target = scope.get("root_path", "") + "/login?" + urlencode({"next": path})
                response: Response = RedirectResponse(target, status_code=303)
            else:
                response = JSONResponse({"error": "authentication required"}, status_code=401,
                                        headers={"WWW-Authenticate": 'Bearer realm="skiplock"'})
            await response(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                for name, value in SECURITY_HEADERS:
                    headers.append((name, value))
            await send(message)

        await self.asgi(scope, receive, with_headers)


SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                 b"form-action 'self'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # the login URL carries a token
    (b"cache-control", b"no-store"),
]


# ---- formatting (Jinja filters) ------------------------------------------------------------------

def _ts(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _dur(value: timedelta | float | None) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        return "in " + _dur(-seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return ""
    delta = (now or datetime.now(timezone.utc)) - value
    return ("in " + _dur(-delta)) if delta.total_seconds() < 0 else _dur(delta) + " ago"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


class Dashboard:
    """The pages and actions over one App (``build`` makes the Starlette app)."""

    def __init__(self, app: Any, auth: Auth, *, redact: Any, poll_seconds: float, bulk_max: int):
        self.app, self.auth, self.redact = app, auth, redact
        self.poll_seconds, self.bulk_max = poll_seconds, bulk_max
        self.env = Environment(loader=FileSystemLoader(str(HERE.joinpath("templates"))),
                               autoescape=select_autoescape(default=True, default_for_string=True))
        self.env.filters.update(ts=_ts, dur=_dur, ago=_ago, pretty=_pretty)

    # ---- rendering ---------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        identity: Identity | None = request.scope.get("skiplock.identity")
        base = request.scope.get("root_path", "")
        fragment = request.query_params.get("fragment") == "1" and "live" in context
        template = self.env.get_template(context["live"] if fragment else name)
        html = template.render(base=base, identity=identity, request=request, poll=self.poll_seconds,
                               now=datetime.now(timezone.utc), message=request.query_params.get("message"),
                               path=_route_path(request.scope), **context)
        return HTMLResponse(html, status_code=status)

    def redacted_args(self, task: str, args: dict[str, Any]) -> Any:
        if self.redact is None:
            return args
        if callable(self.redact):
            return self.redact(task, dict(args))
        keys = set(self.redact.get(task, ()))
        return {k: ("[redacted]" if k in keys else v) for k, v in args.items()}

    # ---- login -------------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        base = request.scope.get("root_path", "")
        next_path = request.query_params.get("next", "/")
        token = request.query_params.get("token")
        if request.method == "POST":
            form = await request.form()
            token = str(form.get("token") or "")
            next_path = str(form.get("next") or "/")
        if not next_path.startswith("/") or next_path.startswith("//"):
            next_path = "/"  # never an open redirect
        if token is not None:
            role = self.auth.role_for_token(token)
            if role is None:
                return self.render(request, "login.html", status=401, next=next_path, error="That token is not valid.")
            response = RedirectResponse(base + next_path, status_code=303)
            response.set_cookie(COOKIE, self.auth.make_session(role), max_age=int(self.auth.session_seconds),
                                path=base or "/", httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
            return response
        return self.render(request, "login.html", next=next_path, error=None)

    async def logout(self, request: Request) -> Response:
        base = request.scope.get("root_path", "")
        response = RedirectResponse(base + "/login", status_code=303)
        response.delete_cookie(COOKIE, path=base or "/")
        return response

    # ---- pages -------------------------------------------------------------------------------

    def overview_data(self) -> dict[str, Any]:
        rm = self.app.read_model
        counts = rm.counts()
        states = [s.value for s in JobState]
        queues = sorted({c.queue for c in counts})
        table = {q: {s: 0 for s in states} for q in queues}
        totals = {s: 0 for s in states}
        for c in counts:
            table[c.queue][c.state] = c.count
            totals[c.state] += c.count
        minutes = rm.throughput(timedelta(hours=1))
        done = sum(m.done for m in minutes)
        failed = sum(m.failed for m in minutes)
        peak = max([m.done + m.failed + m.cancelled for m in minutes] or [0])
        return {"states": states, "queues": queues, "table": table, "totals": totals, "minutes": minutes,
                "done_hour": done, "failed_hour": failed, "peak": peak,
                "failure_rate": (failed / (done + failed)) if done + failed else None,
                "ready": rm.oldest_ready(), "failures": rm.failures(since=timedelta(hours=1))[:20]}

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", live="overview_live.html", title="Overview",
                           **self.overview_data())

    def jobs(self, request: Request) -> Response:
        params = request.query_params
        try:
            flt = filter_from(params)
            page = self.app.read_model.find_jobs(flt, limit=_page_size(params.get("limit")), after=params.get("after"))
        except ValueError as exc:
            return self.render(request, "jobs.html", status=400, title="Jobs", error=str(exc), flt=JobFilter(),
                               form=dict(params), rows=[], next_url=None, bulk_states=BULK_STATES)
        next_url = None
        if page.cursor is not None:
            query = {k: v for k, v in params.items() if k != "after"}
            query["after"] = page.cursor
            next_url = "?" + urlencode(query)
        return self.render(request, "jobs.html", title="Jobs", flt=flt, form=dict(params), rows=page.items,
                           next_url=next_url, error=None, bulk_states=BULK_STATES)

    def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            job = self.app.get_job(job_id)
        except JobNotFound:
            return self.render(request, "error.html", status=404, title="Not found", error=f"no job with id {job_id}")
        timeline = [("enqueued", job.created_at, None), ("due", job.run_at, None)]
        for entry in job.errors:
            timeline.append((f"attempt {entry.get('attempt', '?')} failed", _parse(entry.get("at")),
                             entry.get("worker")))
        if job.started_at:
            timeline.append(("last attempt started", job.started_at, job.worker))
        if job.finished_at:
            timeline.append((f"finished: {job.state.value}", job.finished_at, None))
        timeline.sort(key=lambda e: e[1] or datetime.max.replace(tzinfo=timezone.utc))
        return self.render(request, "job.html", title=f"Job {job.id}", job=job,
                           args=self.redacted_args(job.task, job.args), timeline=timeline)

    def running(self, request: Request) -> Response:
        rm = self.app.read_model
        return self.render(request, "running.html", live="running_live.html", title="Running now",
                           running=rm.running_now(limit=500).items, batches=rm.batches_in_flight(limit=100).items)

    def workers(self, request: Request) -> Response:
        from ..worker.presence import SEEN_INTERVAL

        workers = self.app.read_model.workers(limit=500).items
        stale_after = timedelta(seconds=2 * SEEN_INTERVAL + 1)
        return self.render(request, "workers.html", live="workers_live.html", title="Workers", workers=workers,
                           stale_after=stale_after)

    def queues(self, request: Request) -> Response:
        ready = {q.queue: q for q in self.app.read_model.oldest_ready()}
        return self.render(request, "queues.html", live="queues_live.html", title="Queues",
                           queues=self.app.queues(), ready=ready)

    def cron(self, request: Request) -> Response:
        now = datetime.now(timezone.utc)
        rows = []
        for name, schedule in sorted(self.app.schedules.items()):
            rows.append({"name": name, "cron": schedule.cron, "tz": str(schedule.tz), "missed": schedule.missed,
                         "last": self.app.read_model.last_fire(name), "next": schedule.next_after(now)})
        return self.render(request, "cron.html", title="Cron", schedules=rows)

    def outbox(self, request: Request) -> Response:
        box = self.app.outbox
        return self.render(request, "outbox.html", title="Outbox", counts=box.counts(),
                           failed=box.failed(limit=100), pending=box.list_messages(state="pending", limit=100))

    def audit(self, request: Request) -> Response:
        page = self.app.read_model.audit_log(limit=100, after=request.query_params.get("after"))
        next_url = "?" + urlencode({"after": page.cursor}) if page.cursor else None
        return self.render(request, "audit.html", title="Audit log", entries=page.items, next_url=next_url)

    # ---- the JSON API (bearer or session) ----------------------------------------------------

    def api_overview(self, request: Request) -> Response:
        rm = self.app.read_model
        return JSONResponse({"counts": [c.__dict__ for c in rm.counts()],
                             "ready": [{"queue": q.queue, "ready": q.ready, "age_seconds": q.age.total_seconds(),
                                        "paused": q.paused} for q in rm.oldest_ready()],
                             "running": len(all_pages(rm.running_now, 1000))})

    # ---- actions -----------------------------------------------------------------------------

    async def _authorise(self, request: Request) -> tuple[Identity, Any] | Response:
        identity: Identity = request.scope["skiplock.identity"]
        form = await request.form()
        if not identity.can_act:
            return PlainTextResponse("forbidden: this token is read-only (use the operator token)", status_code=403)
        if not self.auth.csrf_ok(identity, str(form.get("csrf") or request.headers.get("x-csrf-token") or "")):
            return PlainTextResponse("forbidden: missing or wrong CSRF token (reload the page)", status_code=403)
        return identity, form

    def _audit(self, request: Request, identity: Identity, action: str, target: Mapping[str, Any], n: int) -> None:
        client = request.client.host if request.client else None
        self.app.read_model.backend.audit_write(identity.actor(client), action, target, n)

    def _back(self, request: Request, where: str, message: str) -> Response:
        base = request.scope.get("root_path", "")
        sep = "&" if "?" in where else "?"
        return RedirectResponse(f"{base}{where}{sep}message={quote(message)}", status_code=303)

    async def job_action(self, request: Request) -> Response:
        checked = await self._authorise(request)
        if isinstance(checked, Response):
            return checked
        identity, form = checked
        job_id, action = request.path_params["job_id"], request.path_params["action"]
        if action not in ("retry", "cancel", "delete"):
            return PlainTextResponse("unknown action", status_code=404)

        def act() -> str:
            try:
                if action == "retry":
                    self.app.retry_job(job_id)
                    n, text = 1, f"job {job_id} put back in the queue"
                elif action == "cancel":
                    state = self.app.cancel_job(job_id, reason="cancelled from the dashboard", wait=2.0)
                    n, text = int(state == JobState.CANCELLED), f"job {job_id} is {state.value}"
                elif action == "delete":
                    n = len(self.app.read_model.backend.delete_finished_jobs([job_id]))
                    text = f"job {job_id} deleted" if n else f"job {job_id} was not deleted (only finished jobs are)"
                else:  # pragma: no cover - refused above
                    return "unknown action"
            except (InvalidJob, DuplicateJob, JobNotFound) as exc:
                n, text = 0, str(exc)
            self._audit(request, identity, action, {"job_id": job_id}, n)
            return text

        text = await run_in_threadpool(act)
        back = str(form.get("back") or "")
        where = back if back in ("/running", "/jobs") else "/jobs" if action == "delete" else f"/jobs/{job_id}"
        return self._back(request, where, text)

    async def bulk(self, request: Request) -> Response:
        """Bulk retry/cancel/delete of the jobs matching a filter: first a confirmation page saying
        how many rows it touches, then (``confirm=yes``) the action, on at most ``bulk_max`` jobs."""
        checked = await self._authorise(request)
        if isinstance(checked, Response):
            return checked
        identity, form = checked
        action = str(form.get("action") or "")
        try:
            flt = filter_from(form)
        except ValueError as exc:
            return self.render(request, "error.html", status=400, title="Bad filter", error=str(exc))
        if action not in BULK_STATES or flt.state not in BULK_STATES.get(action, ()):
            allowed = ", ".join(BULK_STATES.get(action, ()))
            return self.render(request, "error.html", status=400, title="Choose a state",
                               error=f"to {action or 'act on'} jobs in bulk, filter by state first ({allowed})")
        if form.get("confirm") != "yes":
            count, more = await run_in_threadpool(self.app.read_model.count_jobs, flt, cap=self.bulk_max)
            return self.render(request, "confirm.html", title="Confirm", action=action, flt=flt, count=count,
                               more=more, fields=flt.described(), cap=self.bulk_max)

        def act() -> tuple[int, int]:
            matched = affected = 0
            before = None
            while matched < self.bulk_max:
                ids = self.app.read_model.matching_ids(flt, limit=min(500, self.bulk_max - matched), before=before)
                if not ids:
                    break
                matched += len(ids)
                before = ids[-1]
                if action == "delete":
                    affected += len(self.app.read_model.backend.delete_finished_jobs(ids))
                    continue
                for job_id in ids:
                    try:
                        if action == "retry":
                            self.app.retry_job(job_id)
                            affected += 1
                        elif self.app.cancel_job(job_id, reason="cancelled from the dashboard (bulk)",
                                                 wait=0.0) == JobState.CANCELLED:
                            affected += 1
                    except (InvalidJob, DuplicateJob, JobNotFound):
                        pass  # finished, retried or deleted meanwhile: not touched
            self._audit(request, identity, f"bulk {action}", {"filter": flt.described(), "matched": matched},
                        affected)
            return matched, affected

        matched, affected = await run_in_threadpool(act)
        query = urlencode({k: v for k, v in flt.described().items()})
        return self._back(request, f"/jobs?{query}", f"{action}: {affected} of {matched} matching jobs")

    async def queue_action(self, request: Request) -> Response:
        checked = await self._authorise(request)
        if isinstance(checked, Response):
            return checked
        identity, _ = checked
        queue, action = request.path_params["queue"], request.path_params["action"]
        if action not in ("pause", "resume"):
            return PlainTextResponse("unknown action", status_code=404)

        def act() -> str:
            try:
                if action == "pause":
                    self.app.pause_queue(queue, force=True)
                    text, n = f"queue {queue} paused", 1
                else:
                    n = int(self.app.resume_queue(queue))
                    text = f"queue {queue} resumed" if n else f"queue {queue} was not paused"
            except (SkiplockError, ValueError) as exc:
                text, n = str(exc), 0
            self._audit(request, identity, action, {"queue": queue}, n)
            return text

        return self._back(request, "/queues", await run_in_threadpool(act))

    async def redrive(self, request: Request) -> Response:
        checked = await self._authorise(request)
        if isinstance(checked, Response):
            return checked
        identity, form = checked
        message_id = str(form.get("id") or "")

        def act() -> str:
            ids = [int(message_id)] if message_id.isdigit() else None
            redriven = self.app.outbox.redrive(ids)
            self._audit(request, identity, "outbox redrive", {"ids": ids or "all failed"}, len(redriven))
            return f"{len(redriven)} message(s) redriven"

        return self._back(request, "/outbox", await run_in_threadpool(act))


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def _page_size(value: str | None) -> int:
    if not value:
        return 50
    if not value.isdigit() or not 1 <= int(value) <= 500:
        raise ValueError(f"limit must be a whole number from 1 to 500, got {value!r}")
    return int(value)


def _when(name: str, value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be a date and time such as 2026-12-01T10:00, got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def filter_from(params: Mapping[str, Any]) -> JobFilter:
    """A JobFilter from query or form fields (empty fields: any); times without a zone are UTC."""
    def text(key: str) -> str | None:
        value = params.get(key)
        return str(value).strip() or None if value is not None else None

    return JobFilter(state=text("state"), queue=text("queue"), task=text("task"), error_class=text("error_class"),
                     since=_when("since", text("since")), until=_when("until", text("until")), args=text("args"))


def build(app: Any, auth: Auth, *, routes: Sequence[Any], redact: Any, poll_seconds: float,
          bulk_max: int) -> Starlette:
    if not (isinstance(poll_seconds, (int, float)) and math.isfinite(poll_seconds) and poll_seconds > 0):
        raise ValueError(f"poll_seconds must be a positive number, got {poll_seconds!r}")
    if isinstance(bulk_max, bool) or not isinstance(bulk_max, int) or not 1 <= bulk_max <= 10_000:
        raise ValueError(f"bulk_max must be an integer from 1 to 10000, got {bulk_max!r}")
    d = Dashboard(app, auth, redact=redact, poll_seconds=poll_seconds, bulk_max=bulk_max)
    table: list[Any] = [
        Route("/", d.overview),
        Route("/login", d.login, methods=["GET", "POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/jobs", d.jobs),
        Route("/jobs/bulk", d.bulk, methods=["POST"]),
        Route("/jobs/{job_id:int}", d.job),
        Route("/jobs/{job_id:int}/{action:str}", d.job_action, methods=["POST"]),
        Route("/running", d.running),
        Route("/workers", d.workers),
        Route("/queues", d.queues),
        Route("/queues/{queue:path}/{action:str}", d.queue_action, methods=["POST"]),  # a queue name may hold "/"
        Route("/cron", d.cron),
        Route("/outbox", d.outbox),
        Route("/outbox/redrive", d.redrive, methods=["POST"]),
        Route("/audit", d.audit),
        Route("/api/overview", d.api_overview),
        Mount("/static", StaticFiles(directory=str(HERE.joinpath("static"))), name="static"),
        *routes,
    ]
    web = Starlette(routes=table)
    web.state.dashboard = d
    return AuthMiddleware(web, auth)  # type: ignore[return-value]
