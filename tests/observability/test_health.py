"""The health endpoints (observability/health.py): /livez and /readyz on the dashboard (public: no
job data) and on ``skiplock worker --health-port``, ready only while the database answers."""

from __future__ import annotations

import socket
import subprocess
import textwrap

import httpx
from starlette.testclient import TestClient

import skiplock
from skiplock.dashboard import create_app

from support import cli_argv, cli_env, wait_for

TOKEN = "viewer-token-0123456789abcdef"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def test_the_dashboard_answers_health_probes_without_a_token(app):
    with TestClient(create_app(app, token=TOKEN)) as c:
        assert (c.get("/livez").status_code, c.get("/livez").text) == (200, "ok\n")
        assert (c.get("/readyz").status_code, c.get("/readyz").text) == (200, "ready\n")
        assert c.get("/api/overview").status_code == 401  # still closed everywhere else


def test_not_ready_while_the_database_does_not_answer_and_no_secret_said():
    dsn = f"postgresql://skiplock:s3cret-password@127.0.0.1:{closed_port()}/nowhere?connect_timeout=2"
    down = skiplock.App(dsn, connect_timeout=2)
    try:
        with TestClient(create_app(down, token=TOKEN)) as c:
            assert c.get("/livez").status_code == 200
            r = c.get("/readyz")
            assert r.status_code == 503 and r.text.startswith("database unavailable (")
            assert "s3cret" not in r.text and "127.0.0.1" not in r.text
    finally:
        down.close()


def test_the_worker_serves_health_on_its_own_port(dsn, tmp_path):
    (tmp_path / "healthapp.py").write_text(textwrap.dedent("""
        import skiplock
        app = skiplock.App()

        @app.task(name="noop")
        def noop(job):
            return None
    """))
    port = closed_port()
    proc = subprocess.Popen(cli_argv(dsn, "worker", "--app", "healthapp:app", "--concurrency", "1",
                                     "--health-port", str(port)),
                            cwd=tmp_path, env=cli_env(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "the worker's /readyz")
        live = httpx.get(f"http://127.0.0.1:{port}/livez", timeout=2)
        assert (live.status_code, live.text) == (200, "ok\n")
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 404
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"health at http://127.0.0.1:{port}/livez" in err
