"""``skiplock dashboard``, the real command in a real process: closed by default (a generated token
printed as a login URL), tokens from files, one-line errors (exit 2), and the extra's hint."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import httpx

from support import wait_for


def env_for(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update(SKIPLOCK_DSN=dsn, PYTHONUNBUFFERED="1", **extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_token_one_is_generated_and_printed_as_a_login_url(dsn):
    import skiplock

    with skiplock.App(dsn) as app:  # one job due in "mail": the sampled gauge of /metrics shows it
        app.enqueue("send", {}, queue="mail")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "dashboard", "--port", str(port)],
                            env=env_for(dsn), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        match = re.search(rf"log in at (http://127\.0\.0\.1:{port}/login\?token=(\S+))", line)
        assert match, line
        url, token = match.groups()
        assert len(token) >= 32

        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(up, 30, "the dashboard to listen")
        assert httpx.get(f"http://127.0.0.1:{port}/api/overview").status_code == 401
        with httpx.Client() as c:
            r = c.get(url)
            assert r.status_code == 303 and "skiplock_session" in r.headers["set-cookie"]
            assert c.get(f"http://127.0.0.1:{port}/queues").status_code == 200  # the session cookie
        assert httpx.get(f"http://127.0.0.1:{port}/api/overview",
                         headers={"Authorization": f"Bearer {token}"}).status_code == 200
        # /metrics is served by default, behind the same token (the sampled queue gauges included)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 401
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert metrics.status_code == 200, metrics.text
        assert 'skiplock_queue_ready_jobs{queue="mail"} 1.0' in metrics.text, metrics.text
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_a_short_token_file_is_refused_in_one_line(dsn, tmp_path):
    short = tmp_path / "token"
    short.write_text("abc\n")
    short.chmod(0o600)
    r = subprocess.run([sys.executable, "-m", "skiplock", "--quiet", "dashboard", "--token-file", str(short)],
                       env=env_for(dsn), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "at least 16 characters" in r.stderr and "Traceback" not in r.stderr


def test_without_the_extra_the_command_says_what_to_install(dsn):
    code = ("import sys; sys.modules['uvicorn'] = None; from skiplock.cli import main; "
            "sys.argv = ['skiplock', '--quiet', 'dashboard']; main()")
    r = subprocess.run([sys.executable, "-c", code], env=env_for(dsn), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "pip install 'skiplock[dashboard]'" in r.stderr and r.stderr.count("\n") == 1


def test_sigterm_stops_the_dashboard_although_a_live_page_stream_is_open(dsn, tmp_path):
    """A browser tab keeps its /events stream open for minutes; a stop must not wait for it."""
    import signal
    import threading

    token = tmp_path / "token"
    token.write_text("a-viewer-token-0123456789\n")
    token.chmod(0o600)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "dashboard", "--port", str(port),
                             "--token-file", str(token), "--no-metrics"],
                            env=env_for(dsn), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    opened = threading.Event()

    def listen() -> None:
        try:
            with httpx.stream("GET", f"http://127.0.0.1:{port}/events/workers", timeout=60,
                              headers={"Authorization": "Bearer a-viewer-token-0123456789"}) as r:
                for _ in r.iter_lines():
                    opened.set()
        except httpx.HTTPError:
            pass

    try:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(up, 30, "the dashboard to listen")
        reader = threading.Thread(target=listen, daemon=True)
        reader.start()
        assert opened.wait(30), "no event arrived"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # a safety net: without a shutdown timeout it waits for the stream (5 min)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
