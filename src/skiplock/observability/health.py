"""Liveness and readiness endpoints, for systemd watchdogs, load balancers and Kubernetes probes
(docs/deployment.md): ``GET /livez`` and ``GET /readyz``.

- ``/livez``: 200 ``ok`` whenever the process answers (its event loop or HTTP thread runs). A probe
  that fails means the process is wedged: restart it.
- ``/readyz``: 200 ``ready`` when the database answers one cheap read (the workers table, through
  the App's pool, bounded by its ``connect_timeout``) and, for a worker, once its slots have started;
  else 503 and one line saying why (``database unavailable (DatabaseUnavailable)``, ``worker not
  started``). A worker that is not ready keeps running -- it reconnects by itself -- so point a
  liveness probe at ``/livez``, never at ``/readyz``.

They reveal no job data, no DSN and no error text beyond the error's class, so they need no token:
the dashboard serves them next to its login page, and ``skiplock worker --health-port N`` on their
own port (loopback by default). Every request is answered in its own thread; nothing is cached, so a
probe costs one query.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATHS = ("/livez", "/readyz")


def readiness(app: Any, worker: Any = None) -> str | None:
    """None when ready, else why not (one line, no secret)."""
    if worker is not None and not worker.started.is_set():
        return "worker not started"
    try:
        app.read_model.workers(limit=1)
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; only its class is shown
        return f"database unavailable ({type(exc).__name__})"
    return None


def respond(path: str, app: Any, worker: Any = None) -> tuple[int, str]:
    """(HTTP status, body) of a health path (404 for another path)."""
    if path == "/livez":
        return 200, "ok\n"
    if path == "/readyz":
        why = readiness(app, worker)
        return (200, "ready\n") if why is None else (503, why + "\n")
    return 404, "not found\n"


def health_asgi_app(app: Any, worker: Any = None) -> Any:
    """An ASGI app answering ``/livez`` and ``/readyz`` (any other path: 404). Readiness's query runs
    in a thread, never on the event loop."""
    from starlette.concurrency import run_in_threadpool

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        status, body = await run_in_threadpool(respond, path, app, worker)
        data = body.encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(data)).encode()), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": data})

    return asgi


class HealthServer:
    """``/livez`` and ``/readyz`` on ``host:port`` in a daemon thread (``skiplock worker --health-port``);
    ``port`` 0 picks a free one (``.port`` says which). No access log."""

    def __init__(self, app: Any, host: str, port: int, worker: Any = None):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                status, body = respond(self.path.split("?", 1)[0], owner.app, owner.worker)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no access log
                pass

        self.app, self.worker = app, worker
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="skiplock-health", daemon=True)

    def start(self) -> "HealthServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
