"""The dashboard's pages and routes (see docs/dashboard.md); its actions are in actions.py, the
authentication middleware in middleware.py, the template filters and form parsing in filters.py.

Endpoints that read are plain ``def`` functions (Starlette runs them in its thread pool: the App's
calls are synchronous); actions are ``async`` only to read their form, and call the App in the
thread pool too. Every action: operator role, CSRF token for a cookie session, then one audit row.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any, Sequence
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import JobNotFound
from ..job import JobState
from ..readmodel import ARGS_WINDOW, BoundedCount, JobFilter
from .actions import BULK_STATES, Actions
from .auth import COOKIE, Auth, Identity
from .filters import ago, dur, filter_from, latency, page_size, parse_time, pretty, ts
from .middleware import AuthMiddleware, route_path

HERE = resources.files(__package__)

# Counts shown exactly up to this many jobs per queue and state (then estimated: see
# ReadModel.queue_summary); jobs running counted up to RUNNING_CAP on /api/overview.
COUNT_CAP = 1000
RUNNING_CAP = 1000
# A live page's event stream ends after this many seconds (the browser reconnects, authenticated again).
SSE_SECONDS = 300.0


class Dashboard(Actions):
    """The pages and actions over one App (``build`` makes the Starlette app)."""

    def __init__(self, app: Any, auth: Auth, *, redact: Any, poll_seconds: float, bulk_max: int):
        self.app, self.auth, self.redact = app, auth, redact
        self.poll_seconds, self.bulk_max = poll_seconds, bulk_max
        self.env = Environment(loader=FileSystemLoader(str(HERE.joinpath("templates"))),
                               autoescape=select_autoescape(default=True, default_for_string=True))
        self.env.filters.update(ts=ts, dur=dur, ago=ago, pretty=pretty, latency=latency)

    # ---- rendering ---------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        identity: Identity | None = request.scope.get("skiplock.identity")
        base = request.scope.get("root_path", "")
        fragment = request.query_params.get("fragment") == "1" and "live" in context
        template = self.env.get_template(context["live"] if fragment else name)
        html = template.render(base=base, identity=identity, request=request, poll=self.poll_seconds,
                               now=datetime.now(timezone.utc), message=request.query_params.get("message"),
                               path=route_path(request.scope), **context)
        return HTMLResponse(html, status_code=status)

    def redacted_args(self, task: str, args: dict[str, Any]) -> Any:
        if self.redact is None:
            return args
        if callable(self.redact):
            return self.redact(task, dict(args))
        keys = set(self.redact.get(task, ()))
        return {k: ("[redacted]" if k in keys else v) for k, v in args.items()}

    def unredacted_matches(self, rows: list[Any], text: str) -> list[Any]:
        """Those of ``rows`` (an args-text search's page) whose args *as the job page shows them* --
        redacted -- contain ``text``: a search must not tell whether a hidden value holds a text (or
        anyone could read a redacted password a character at a time). The database found the rows
        on the raw args; each one is checked again here on its redacted args. The page's cursor is
        the database's, so no row is skipped: a page may only come back shorter."""
        needle = text.lower()
        out = []
        for row in rows:
            try:
                job = self.app.get_job(row.id)
            except JobNotFound:
                continue  # deleted meanwhile
            shown = json.dumps(self.redacted_args(job.task, job.args), default=str, ensure_ascii=False)
            if needle in shown.lower():
                out.append(row)
        return out

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
        """The overview's figures, each read in bounded time at any table size: the queue summary
        (counts exact up to ``COUNT_CAP``, then estimated), the last hour's throughput and failures
        (ranges of jobs_finished_idx)."""
        rm = self.app.read_model
        summary = rm.queue_summary(cap=COUNT_CAP)
        states = [s.value for s in JobState]
        table = {q.queue: q.counts for q in summary}
        totals = {s: sum((q.counts[s] for q in summary), BoundedCount(0)) for s in states}
        minutes = rm.throughput(timedelta(hours=1))
        done = sum(m.done for m in minutes)
        failed = sum(m.failed for m in minutes)
        peak = max([m.done + m.failed + m.cancelled for m in minutes] or [0])
        return {"states": states, "queues": [q.queue for q in summary], "table": table, "totals": totals,
                "minutes": minutes, "done_hour": done, "failed_hour": failed, "peak": peak,
                "failure_rate": (failed / (done + failed)) if done + failed else None,
                "ready": [q for q in summary if q.ready.n or q.paused], "cap": COUNT_CAP,
                "failures": rm.failures(since=timedelta(hours=1))[:20], "latency": rm.pickup_latency()}

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", live="overview_live.html", title="Overview",
                           **self.overview_data())

    def jobs(self, request: Request) -> Response:
        params = request.query_params
        try:
            flt = filter_from(params)
            limit = page_size(params.get("limit"))
            page = self.app.read_model.find_jobs(flt, limit=limit, after=params.get("after"))
        except ValueError as exc:
            return self.render(request, "jobs.html", status=400, title="Jobs", error=str(exc), flt=JobFilter(),
                               form=dict(params), rows=[], next_url=None, bulk_states=BULK_STATES,
                               searched_from=None)
        rows = self.unredacted_matches(page.items, flt.args) if flt.args and self.redact is not None else page.items
        next_url = None
        if page.cursor is not None:
            query = {k: v for k, v in params.items() if k != "after"}
            query["after"] = page.cursor
            next_url = "?" + urlencode(query)
        return self.render(request, "jobs.html", title="Jobs", flt=flt, form=dict(params), rows=rows,
                           next_url=next_url, error=None, bulk_states=BULK_STATES,
                           searched_from=page.searched_from, limit=limit, window=ARGS_WINDOW)

    def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            job = self.app.get_job(job_id)
        except JobNotFound:
            return self.render(request, "error.html", status=404, title="Not found", error=f"no job with id {job_id}")
        timeline = [("enqueued", job.created_at, None), ("due", job.run_at, None)]
        for entry in job.errors:
            timeline.append((f"attempt {entry.get('attempt', '?')} failed", parse_time(entry.get("at")),
                             entry.get("worker")))
        if job.started_at:
            timeline.append(("last attempt started", job.started_at, job.worker))
        if job.finished_at:
            timeline.append((f"finished: {job.state.value}", job.finished_at, None))
        timeline.sort(key=lambda e: e[1] or datetime.max.replace(tzinfo=timezone.utc))
        ran = []  # each failed attempt's run time, where its entry says when it started
        for entry in job.errors:
            began, ended = parse_time(entry.get("started_at")), parse_time(entry.get("at"))
            ran.append((ended - began).total_seconds() if began and ended else None)
        return self.render(request, "job.html", title=f"Job {job.id}", job=job,
                           args=self.redacted_args(job.task, job.args), timeline=timeline,
                           attempts=list(zip(job.errors, ran)))

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
        """Each queue with jobs, paused or with flow-control limits (a limited queue with no job is
        listed too: its limits are still in force), counts bounded as on the overview; all through
        the read model (:meth:`ReadModel.queue_summary`). A backend without flow control has none."""
        return self.render(request, "queues.html", live="queues_live.html", title="Queues",
                           queues=self.app.read_model.queue_summary(cap=COUNT_CAP))

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

    # ---- live updates (server-sent events; the pages fall back to polling) -------------------

    LIVE_PAGES = ("overview", "running", "workers", "queues")

    async def events(self, request: Request) -> Response:
        """``GET /events/{page}``: the live region of one page (overview, running, workers, queues)
        as a stream of server-sent events -- the fragment's HTML as an ``update`` event whenever it
        changed, read every ``poll_seconds``, a comment line otherwise (so a dead client is noticed).
        A stream ends after ``SSE_SECONDS`` (the browser's EventSource reconnects, and the request is
        authenticated again: an expired session or a changed token ends the updates)."""
        name = request.path_params["page"]
        if name not in self.LIVE_PAGES:
            return JSONResponse({"error": f"no live page {name!r}"}, status_code=404)
        handler = self.overview if name == "overview" else getattr(self, name)
        scope = dict(request.scope, query_string=b"fragment=1")

        async def stream() -> Any:
            last = None
            ends = time.monotonic() + SSE_SECONDS
            yield f"retry: {int(self.poll_seconds * 1000)}\n\n"
            while time.monotonic() < ends and not await request.is_disconnected():
                response = await run_in_threadpool(handler, Request(scope))
                html = bytes(response.body).decode()
                if html != last:
                    last = html
                    yield "event: update\n" + "".join(f"data: {line}\n" for line in html.split("\n")) + "\n"
                else:
                    yield ": unchanged\n\n"
                await asyncio.sleep(self.poll_seconds)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})  # a proxy must not buffer it

    # ---- health (public: no job data; observability/health.py) -------------------------------

    def health(self, request: Request) -> Response:
        from ..observability.health import respond

        status, body = respond(route_path(request.scope), self.app)
        return Response(body, status_code=status, media_type="text/plain")

    # ---- the JSON API (bearer or session) ----------------------------------------------------

    def api_overview(self, request: Request) -> Response:
        """Per queue: counts per state (``n``; ``exact`` False: more than ``n``, about ``estimate``),
        ready jobs and the head's wait; and how many jobs run now (at most ``RUNNING_CAP``: more is
        ``running_more``)."""
        rm = self.app.read_model
        summary = rm.queue_summary(cap=COUNT_CAP)
        running = rm.running_now(limit=RUNNING_CAP)

        def count(c: BoundedCount) -> dict[str, Any]:
            return {"n": c.n, "exact": c.exact, "estimate": c.estimate}

        return JSONResponse({
            "queues": [{"queue": q.queue, "paused": q.paused, "counts": {s: count(c) for s, c in q.counts.items()},
                        "ready": count(q.ready),
                        "head_age_seconds": None if q.head_age is None else q.head_age.total_seconds(),
                        "limits": None if q.limits is None else {"concurrency": q.limits.concurrency,
                                                                 "rate": q.limits.rate, "fair": q.limits.fair,
                                                                 "weights": q.limits.weights}}
                       for q in summary],
            # the form of earlier versions: exact counts only (a capped one is left out of it)
            "counts": [{"queue": q.queue, "state": s, "count": c.n} for q in summary for s, c in q.counts.items()
                       if c.n and c.exact],
            "ready": [{"queue": q.queue, "ready": q.ready.n, "age_seconds": q.head_age.total_seconds(),
                       "paused": q.paused} for q in summary if q.head_age is not None],
            "running": len(running), "running_more": running.cursor is not None})


def build(app: Any, auth: Auth, *, routes: Sequence[Any], redact: Any, poll_seconds: float,
          bulk_max: int, trusted_origins: Sequence[str] = ()) -> Starlette:
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
        Route("/events/{page:str}", d.events),
        Route("/livez", d.health),
        Route("/readyz", d.health),
        Mount("/static", StaticFiles(directory=str(HERE.joinpath("static"))), name="static"),
        *routes,
    ]
    web = Starlette(routes=table)
    web.state.dashboard = d
    return AuthMiddleware(web, auth, trusted_origins)  # type: ignore[return-value]
