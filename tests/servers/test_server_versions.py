"""The PostgreSQL versions skiplock runs on (issue 15 item 5): a server older than
``MIN_SERVER_VERSION`` is refused at the first connection with one clear line (naming the version
found and the one needed, never the password); the oldest supported one (15, the private server of
tests/pg15_server.py) is accepted. The refusal is tested against the real PostgreSQL 15 by raising
the minimum above it: the version compared is the one the real server reports."""

from __future__ import annotations

import pytest

import skiplock
from skiplock.backend.postgres import connecting
from skiplock.errors import ConfigurationError


def test_postgresql_15_is_supported_and_runs_a_job(pg15_dsn: str) -> None:
    app = skiplock.App(pg15_dsn)
    seen: list[int] = []

    @app.task(name="t")
    def t(job: skiplock.Job) -> None:
        seen.append(job.conn.info.server_version)

    try:
        job_id = app.enqueue("t", {})
        app.worker(concurrency=1).run(stop_when_empty=True)
        assert app.get_job(job_id).state == "done"
        assert seen and 150000 <= seen[0] < 160000
    finally:
        app.close()


def test_a_server_older_than_the_minimum_is_refused_with_one_clear_line(
        pg15_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connecting, "MIN_SERVER_VERSION", 160000)  # above the real server's 15
    app = skiplock.App(pg15_dsn)
    try:
        with pytest.raises(ConfigurationError) as err:
            app.enqueue("t", {})
        message = str(err.value)
        assert "\n" not in message
        assert "PostgreSQL 15." in message and "needs PostgreSQL 16 or newer" in message, message
        assert "password" not in message.lower() or "passfile" in message
        with pytest.raises(ConfigurationError):
            app.worker(concurrency=1).run(stop_when_empty=True)
    finally:
        app.close()
