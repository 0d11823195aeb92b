"""AsyncApp is written out: every method is defined in its class body (not attached at import), with
App's signature, so mypy and IDEs see it."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import skiplock
from skiplock.aio import AsyncApp

ROOT = Path(__file__).resolve().parents[2]

# The App methods AsyncApp offers as coroutines (same parameters), and the ones it offers as they are.
COROUTINES = ("migrate", "check", "enqueue", "enqueue_many", "get_job", "list_jobs", "counts", "live_workers",
              "untakeable_jobs", "cancel_job", "retry_job", "retry_failed", "pause_queue", "resume_queue", "queues",
              "wait", "prune", "close", "set_queue_limits", "queue_limits", "clearing_queue_limits", "set_task_limits", "task_limits")
PLAIN = ("task", "periodic", "outbox")
# App members that configure or build objects, reached as ``aapp.app.<name>`` (``run_worker`` runs a worker).
ON_APP_ONLY = ("configure", "dsn", "backend", "get_task", "worker", "relay", "read_model",  # read_model: sync views
               "on", "enable_metrics", "enable_tracing")  # observability: hooks and metrics are the App's (aapp.app.on(...))


def test_every_public_app_member_is_on_async_app_or_named_as_app_only():
    """A new App method gets its AsyncApp coroutine (here and in COROUTINES), or is listed above."""
    public = {name for name in dir(skiplock.App) if not name.startswith("_")}
    missing = public - set(COROUTINES) - set(PLAIN) - set(ON_APP_ONLY)
    assert not missing, f"App has {sorted(missing)}: write them out in AsyncApp (aio.py) too"
    assert not set(ON_APP_ONLY) & set(vars(AsyncApp))


def test_every_async_app_method_is_defined_in_the_class_body():
    source = inspect.getsource(AsyncApp)
    for name in COROUTINES + ("task", "periodic", "run_worker"):
        method = vars(AsyncApp).get(name)
        assert method is not None, f"AsyncApp.{name} is not defined in the class body"
        assert method.__qualname__ == f"AsyncApp.{name}", f"AsyncApp.{name} is {method.__qualname__}"
        assert f"def {name}(" in source, f"AsyncApp.{name} is not written out in the class"
    for name in COROUTINES + ("run_worker",):
        assert inspect.iscoroutinefunction(vars(AsyncApp)[name]), f"AsyncApp.{name} is not a coroutine function"


def test_async_app_methods_take_exactly_apps_parameters():
    for name in COROUTINES + ("task", "periodic"):
        ours = list(inspect.signature(vars(AsyncApp)[name]).parameters.values())
        theirs = list(inspect.signature(getattr(skiplock.App, name)).parameters.values())
        described = [(p.name, p.kind, p.default, p.annotation) for p in ours]
        assert described == [(p.name, p.kind, p.default, p.annotation) for p in theirs], name
        returns = inspect.signature(vars(AsyncApp)[name]).return_annotation
        assert returns == inspect.signature(getattr(skiplock.App, name)).return_annotation, name


SNIPPET = '''
import asyncio
from typing import Any

import psycopg
import skiplock


async def main(conn: psycopg.AsyncConnection[Any]) -> None:
    aapp = skiplock.AsyncApp("postgresql:///x")

    @aapp.task(name="t")
    def t(job: skiplock.Job) -> None:
        pass

    job_id: int = await aapp.enqueue("t", {"a": 1}, conn=conn, unique_key="k")
    ids: list[int] = await aapp.enqueue_many([("t", {})], conn=conn)
    job: skiplock.Job = await aapp.get_job(job_id)
    jobs: list[skiplock.Job] = await aapp.list_jobs(state="failed", limit=5)
    state: skiplock.JobState = await aapp.cancel_job(job_id)
    reveal_type(aapp.get_job)
    reveal_type(await aapp.counts())
    reveal_type(await aapp.retry_failed())
    reveal_type(await aapp.wait(job_id, timeout=1.0))
    reveal_type(await aapp.run_worker(concurrency=2, stop_when_empty=True))
    await aapp.pause_queue("q", force=True)
    await aapp.get_job("not an id")  # the one error expected
    await aapp.close()
'''


def test_mypy_sees_async_app_methods_and_their_types():
    with tempfile.TemporaryDirectory(prefix="skiplock-mypy-") as tmp:
        snippet = Path(tmp) / "user_code.py"
        snippet.write_text(textwrap.dedent(SNIPPET))
        result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(Path(tmp) / "cache"),
                                 "--follow-imports=silent", "--no-error-summary", "--config-file", "",
                                 str(snippet)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = result.stdout.replace(str(snippet), "user_code.py").replace("builtins.", "")  # mypy versions differ
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("user_code.py:")]
    assert lines == [
        'note: Revealed type is "def (job_id: int) -> typing.Coroutine[Any, Any, skiplock.job.Job]"',
        'note: Revealed type is "list[tuple[str, str, int]]"',
        'note: Revealed type is "skiplock.operations.RetriedJobs"',
        'note: Revealed type is "Any"',
        'note: Revealed type is "skiplock.worker.stats.WorkerStats"',
        'error: Argument 1 to "get_job" of "AsyncApp" has incompatible type "str"; expected "int"  [arg-type]',
    ], out + result.stderr
