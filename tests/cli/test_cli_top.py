"""``skiplock top``: the live view, run for a bounded number of refreshes against a real worker."""

from __future__ import annotations

import json
import re

from cli_support import ok, run
from support import wait_for


def test_top_shows_queues_throughput_and_the_running_job(dsn, holding_worker):
    _, release = holding_worker
    held = ok(run(dsn, "enqueue", "hold", "--app", "cli_tasks:app", "--args",
                  json.dumps({"release": str(release)}))).stdout.strip()
    ok(run(dsn, "enqueue", "mail.send", "--app", "cli_tasks:app", "--args", '{"to": "a@x"}'))
    wait_for(lambda: '"job_id": ' + held in run(dsn, "status", "--json").stdout, what="the job running")
    out = ok(run(dsn, "top", "--iterations", "2", "--interval", "0.1")).stdout
    assert out.count("skiplock top (schema skiplock)") == 2, out  # two refreshes, then it exits
    assert "throughput:" in out and "jobs/s finished" in out, out
    rows = [line for line in out.splitlines() if line.startswith(f"│ {held} ")]
    assert rows and all("hold" in r and "transaction" in r for r in rows), out
    assert any(re.match(r"│ mail\s+│\s+1 │", line) for line in out.splitlines()), out  # 1 queued
    assert str(holding_worker[0].pid) in out, out


def test_top_on_a_terminal_redraws_in_place(dsn):
    """On a terminal (a real pseudo-terminal here) the view is rich's Live display: it runs its
    refreshes and exits 0, the screen showing the view."""
    import os
    import pty
    import subprocess
    import sys

    from cli_support import HERE
    from support import cli_env

    ok(run(dsn, "enqueue", "effect"))
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "top", "--iterations", "3",
                                 "--interval", "0.1"], cwd=HERE, env=cli_env(HERE, SKIPLOCK_DSN=dsn, TERM="xterm"),
                                stdin=follower, stdout=follower, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process has exited
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert "skiplock top (schema skiplock)" in screen and "Traceback" not in screen, screen
    assert "\x1b[" in screen  # drawn with terminal control sequences (Live), not printed frame after frame


def test_status_watch_is_the_live_view(dsn):
    import signal
    import subprocess
    import sys

    from cli_support import HERE
    from support import cli_env

    proc = subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "status", "--watch"], cwd=HERE,
                            env=cli_env(HERE, SKIPLOCK_DSN=dsn), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first frame of the view
            if "skiplock top (schema skiplock)" in line:
                break
        else:
            raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 130  # Ctrl-C ends it: "interrupted"
