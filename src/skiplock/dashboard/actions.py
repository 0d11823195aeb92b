"""The dashboard's actions: retry, cancel or delete a job or every job matching a filter, pause or
resume a queue, redrive the outbox. Each: operator role, CSRF for a cookie session, one audit row."""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from ..errors import DuplicateJob, InvalidJob, JobNotFound, SkiplockError
from ..job import JobState
from .auth import Auth, Identity
from .filters import filter_from


FINISHED_STATES = ("done", "failed", "cancelled")
# Which states a bulk action applies to (the filter's state must be one of them: the confirmation's
# count is then exactly the rows it touches).
BULK_STATES = {"retry": ("failed", "cancelled"), "cancel": ("queued", "running", "blocked"), "delete": FINISHED_STATES}


class Actions:
    """The dashboard's actions (a mixin of :class:`~skiplock.dashboard.web.Dashboard`): every one needs
    the operator role, a CSRF token for a cookie session, then writes one audit row."""

    app: Any
    auth: Auth
    bulk_max: int

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        raise NotImplementedError  # Dashboard.render

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
