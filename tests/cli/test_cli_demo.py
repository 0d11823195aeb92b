"""Two ``skiplock demo`` runs at once against one server: each in its own database, both pass, and
each says which database it used and how to look at it afterwards."""

from __future__ import annotations

import re
import subprocess
import sys

from cli_support import HERE
from support import cli_env


def demo(dsn: str, jobs: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "skiplock", "--quiet", "demo", "--jobs", str(jobs), "--workers", "2"],
                            cwd=HERE, env=cli_env(HERE, SKIPLOCK_DSN=dsn), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_demos_at_once_use_their_own_databases(pg_admin_dsn):
    first = demo(pg_admin_dsn, 3000)
    try:
        assert first.stdout is not None
        head = []
        for line in first.stdout:  # wait until the first one's workers run (its database is in use)
            head.append(line)
            if line.startswith("started "):
                break
        second = demo(pg_admin_dsn, 3000)
        out2, err2 = second.communicate(timeout=300)
        out1, err1 = first.communicate(timeout=300)
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    out1 = "".join(head) + out1
    assert first.returncode == 0, out1[-3000:] + err1[-3000:]
    assert second.returncode == 0, out2[-3000:] + err2[-3000:]
    used = []
    for out in (out1, out2):
        assert "every job done, every database-local effect exactly once" in out, out
        # the kill, in words: "with job(s) 5, 6 in flight", or "with 24 jobs, 3367…3482 in flight"
        assert re.search(r"SIGKILL worker \d+ with (job\(s\) \d+(, \d+)*|\d+ jobs, \d+…\d+) in flight", out), out
        (database,) = set(re.findall(r"The demo's jobs are in database '([^']+)'", out))
        assert re.search(r"skiplock --dsn '[^']*dbname=" + re.escape(database) + r"[^']*' status", out), out
        used.append(database)
    assert used == ["skiplock_demo", "skiplock_demo_2"], used
    assert "another demo is running against this server; this one uses database 'skiplock_demo_2'" in out2, out2
