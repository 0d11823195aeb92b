"""``skiplock worker`` freezes the objects alive at its start out of Python's garbage collector's
walks (worker/gc_freeze.py), unless ``--no-freeze-gc``; ``app.worker()`` only with ``freeze_gc=True``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from cli_support import ok, run

WORKER = ("worker", "--app", "cli_tasks:app", "--concurrency", "1", "--poll-interval", "0.05", "--no-maintenance",
          "--stop-when-empty")


def frozen_seen_by_a_job(dsn, db, *options: str) -> int:
    job_id = int(ok(run(dsn, "enqueue", "gc.frozen", "--app", "cli_tasks:app")).stdout)
    ok(run(dsn, *WORKER, *options))
    state, result = db.execute("SELECT state, result FROM skiplock.jobs WHERE id = %s", [job_id]).fetchone()
    assert state == "done"
    return result


def test_the_worker_command_freezes_its_startup_objects(dsn, db):
    assert frozen_seen_by_a_job(dsn, db) > 10_000  # modules, classes, the app: many thousands


def test_no_freeze_gc_leaves_the_collector_alone(dsn, db):
    assert frozen_seen_by_a_job(dsn, db, "--no-freeze-gc") == 0


def test_the_python_api_freezes_only_when_asked(dsn):
    script = textwrap.dedent(f"""
        import gc, skiplock
        app = skiplock.App({dsn!r})
        app.worker(concurrency=1, handle_signals=False, maintenance=False).run(stop_when_empty=True)
        before = gc.get_freeze_count()
        app.worker(concurrency=1, handle_signals=False, maintenance=False, freeze_gc=True).run(stop_when_empty=True)
        print(before, gc.get_freeze_count())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before == 0 and after > 10_000
