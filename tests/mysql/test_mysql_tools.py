"""``skiplock scenario`` and ``skiplock demo`` on a ``mariadb://`` DSN (issue 12, item 6): the seed's
two-session transcript replayed on the private MariaDB, every step checked, the same output as on
PostgreSQL; the demo's workers drain jobs, one is SIGKILLed with jobs in flight, every job ends done
and each effect exists once."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from skiplock.tools.scenario import CLAIM_SQL, run_scenario

from scenario_transcript import SEED_TRANSCRIPT
from support import cli_env

HERE = Path(__file__).resolve().parent


def mariadb(dsn: str) -> str:
    """The fixture's ``mysql://`` DSN under the ``mariadb://`` scheme (both select the backend)."""
    assert dsn.startswith("mysql://")
    return "mariadb://" + dsn[len("mysql://"):]


def run(dsn: str, **kwargs: Any) -> tuple[Any, str]:
    buf = io.StringIO()
    result = run_scenario(mariadb(dsn), out=Console(file=buf, width=120), **kwargs)
    return result, buf.getvalue()


def databases(server: Any) -> set[str]:
    with server.connect() as c, c.cursor() as cur:
        cur.execute("SHOW DATABASES")
        return {r[0] for r in cur.fetchall()}


def test_scenario_on_mariadb_matches_the_seed_step_by_step(mariadb_dsn: str, mariadb_server: Any) -> None:
    result, text = run(mariadb_dsn)
    assert result.ok, result.failures
    assert result.failures == [] and result.steps == 12
    assert SEED_TRANSCRIPT in text  # the same statements, results and narration as on PostgreSQL
    assert "innodb_lock_wait_timeout = 2s" in text and "READ COMMITTED" in text
    assert text.rstrip().splitlines()[-1] == "scenario OK: every step returned what the walk-through expects"
    assert "skiplock_scenario" not in databases(mariadb_server)  # the scratch database is dropped


def test_scenario_on_mariadb_catches_a_claim_without_skip_locked_without_hanging(mariadb_dsn: str) -> None:
    started = time.monotonic()
    result, text = run(mariadb_dsn, claim_sql=CLAIM_SQL.replace("SKIP LOCKED", "NOWAIT"))
    assert time.monotonic() - started < 30  # a safety net: NOWAIT fails at once
    assert not result.ok
    assert [f.step for f in result.failures] == [4]
    assert result.failures[0].expected == "columns (id, task): (2, 'generate invoice')"
    assert "blocked by a row lock the other session holds" in result.failures[0].got
    assert "scenario FAILED at step 4: B claims job 2 without waiting" in text


def test_scenario_on_mariadb_refuses_a_database_it_did_not_create(mariadb_dsn: str, mariadb_server: Any) -> None:
    with mariadb_server.connect() as c, c.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS mine_h")
        cur.execute("CREATE TABLE IF NOT EXISTS mine_h.jobs (id INT)")
    try:
        result, text = run(mariadb_dsn, schema="mine_h")
        assert not result.ok and result.steps == 0
        assert "not a skiplock scenario scratch database" in result.failures[0].got
        assert "mine_h" in databases(mariadb_server)  # never dropped
        hostile = "sc`; DROP DATABASE mine_h; --"
        result, text = run(mariadb_dsn, schema=hostile)
        assert result.ok, result.failures  # a name, not SQL: back-quoted
        assert {"mine_h"} <= databases(mariadb_server) and hostile not in databases(mariadb_server)
    finally:
        with mariadb_server.connect() as c, c.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS mine_h")


def test_scenario_command_on_a_mariadb_dsn(mariadb_dsn: str) -> None:
    done = subprocess.run([sys.executable, "-m", "skiplock", "--quiet", "scenario"], cwd=HERE,
                          env=cli_env(HERE, SKIPLOCK_DSN=mariadb(mariadb_dsn)), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert SEED_TRANSCRIPT in done.stdout.replace("\r", "")


def test_demo_on_mariadb_kills_a_worker_and_every_effect_exists_once(mariadb_dsn: str, mariadb_server: Any) -> None:
    done = subprocess.run([sys.executable, "-m", "skiplock", "--quiet", "demo", "--jobs", "300", "--workers", "2"],
                          cwd=HERE, env=cli_env(HERE, SKIPLOCK_DSN=mariadb(mariadb_dsn)), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=240)
    out = done.stdout
    try:
        check_demo(done, out, mariadb_server)
    finally:
        with mariadb_server.connect() as c, c.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS skiplock_demo")


def check_demo(done: Any, out: str, mariadb_server: Any) -> None:
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"SIGKILL worker \d+ with (job\(s\) \d+(, \d+)*|\d+ jobs, \d+…\d+) in flight", out), out
    assert "every job done, every database-local effect exactly once" in out
    assert "The demo's jobs are in database 'skiplock_demo'" in out
    assert mariadb_server.password not in out + done.stderr
    with mariadb_server.connect("skiplock_demo") as c, c.cursor() as cur:  # checked here too, not only by the demo
        cur.execute("SELECT COUNT(*), SUM(state = 'done') FROM skiplock_jobs")
        assert tuple(int(v) for v in cur.fetchone()) == (300, 300)
        cur.execute("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM demo_effects")
        assert cur.fetchone() == (300, 300)
