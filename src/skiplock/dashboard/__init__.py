"""skiplock's web dashboard: an ASGI app (Starlette, Jinja2 templates, plain JS and CSS served from
this package; no CDN, no build step) over one :class:`skiplock.App` -- its read model
(``app.read_model``) and its public operations only. See docs/dashboard.md.

``create_app(app, token=..., operator_token=...)`` returns the ASGI app; run it with
``skiplock dashboard`` (uvicorn) or mount it in a Starlette/FastAPI app
(``Mount("/skiplock", create_app(app, ...))``) or, through ASGI, in Django.
Needs the ``dashboard`` extra: ``pip install 'skiplock[dashboard]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .auth import OPERATOR, VIEWER, Auth, Identity, new_token

if TYPE_CHECKING:
    from ..app import App

__all__ = ["create_app", "Auth", "Identity", "new_token", "VIEWER", "OPERATOR"]

Redact = Callable[[str, dict], Any] | Mapping[str, Sequence[str]]


def create_app(app: "App", *, token: str | None = None, operator_token: str | None = None,
               secret: bytes | None = None, routes: Sequence[Any] = (), redact: Redact | None = None,
               poll_seconds: float = 3.0, bulk_max: int = 10_000, trusted_origins: Sequence[str] = ()) -> Any:
    """The dashboard of ``app`` as an ASGI app.

    - ``token``: the viewer (read-only) token; ``operator_token``: the operator's (every action).
      At least one is required -- there is no open mode (the CLI generates one when none is set).
    - ``secret``: signs session cookies (default: random per process, so sessions end at restart;
      give the same bytes to every replica behind a load balancer).
    - ``routes``: extra Starlette routes served behind the same authentication (e.g. ``/metrics``);
      a route's endpoint finds the caller in ``request.scope["skiplock.identity"]``.
    - ``redact``: per task, the args keys to hide on the job page (``{"signup": ["password"]}``), or
      a callable ``(task, args) -> args`` shown instead.
    - ``poll_seconds``: how often live pages refresh; ``bulk_max``: the most jobs one bulk action
      touches (newest first; run it again for the rest).
    - ``trusted_origins``: origins (``https://ops.example.com``) allowed to POST besides the one the
      request was sent to (its ``Host``): for a reverse proxy that rewrites ``Host``. Any other
      ``Origin`` on a POST gets 403 (see ``middleware.cross_origin``).
    """
    from .web import build

    return build(app, Auth(token, operator_token, secret=secret), routes=routes, redact=redact,
                 poll_seconds=poll_seconds, bulk_max=bulk_max, trusted_origins=trusted_origins)
