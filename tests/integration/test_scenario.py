"""`skiplock scenario` replays the seed's two-session transcript on a real PostgreSQL and checks each step."""

from __future__ import annotations

import io
import time

import psycopg
import pytest
from rich.console import Console

from skiplock.tools.scenario import CLAIM_SQL, run_scenario

from scenario_transcript import SEED_TRANSCRIPT  # noqa: E402 - shared with tests/mysql/test_mysql_tools.py


def run(dsn: str, **kwargs):
    buf = io.StringIO()
    result = run_scenario(dsn, out=Console(file=buf, width=120), **kwargs)
    return result, buf.getvalue()


def schema_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,)).fetchone() is not None


def test_scenario_matches_the_seed_step_by_step(dsn: str) -> None:
    result, text = run(dsn)
    assert result.ok, result.failures
    assert result.failures == [] and result.steps == 12
    assert SEED_TRANSCRIPT in text  # every statement, result and narration line, in the seed's order
    assert text.index("-- setup (not part of the walk-through)") < text.index("A> BEGIN;")
    assert text.rstrip().splitlines()[-1] == "scenario OK: every step returned what the walk-through expects"


def test_claim_without_skip_locked_fails_at_bs_claim_without_hanging(dsn: str) -> None:
    nowait = CLAIM_SQL.replace("SKIP LOCKED", "NOWAIT")
    result, text = run(dsn, claim_sql=nowait)
    assert not result.ok
    assert [f.step for f in result.failures] == [4]  # A, its updates and B's retry still match the seed
    assert result.failures[0].expected == "columns (id, task): (2, 'generate invoice')"
    assert "LockNotAvailable" in result.failures[0].got
    assert "ORDER BY id LIMIT 1 FOR UPDATE NOWAIT;" in text
    assert "scenario FAILED at step 4: B claims job 2 without waiting" in text


def test_plain_for_update_waits_only_until_lock_timeout(dsn: str) -> None:
    started = time.monotonic()
    result, _ = run(dsn, claim_sql=CLAIM_SQL.replace(" SKIP LOCKED", ""))
    assert time.monotonic() - started < 20
    assert result.failures[0].step == 4
    assert "lock timeout" in result.failures[0].got


def test_descending_order_fails_at_as_claim(dsn: str) -> None:
    result, text = run(dsn, claim_sql=CLAIM_SQL.replace("ORDER BY id", "ORDER BY id DESC"))
    assert not result.ok
    first = result.failures[0]
    assert first.step == 2
    assert first.expected == "columns (id, task): (1, 'send welcome email')"
    assert first.got == "columns (id, task): (2, 'generate invoice')"
    assert 4 in [f.step for f in result.failures]
    assert "scenario FAILED at step 2: A claims the first queued job" in text.rstrip().splitlines()[-1]
    assert not schema_exists(dsn, "skiplock_scenario")  # both sessions rolled back, scratch schema dropped


def test_scratch_schema_is_dropped_and_hostile_names_are_identifiers(dsn: str, db: psycopg.Connection) -> None:
    db.execute("CREATE TABLE public.x (v int)")
    name = 'sc"; drop table x; --'
    result, text = run(dsn, schema=name)
    assert result.ok, result.failures
    assert SEED_TRANSCRIPT in text
    assert not schema_exists(dsn, name)
    assert not schema_exists(dsn, "skiplock_scenario")
    assert db.execute("SELECT to_regclass('public.x') IS NOT NULL").fetchone() == (True,)


def test_keep_leaves_the_final_state_and_a_rerun_reuses_the_schema(dsn: str, db: psycopg.Connection) -> None:
    assert run(dsn, schema="sc_keep", keep=True)[0].ok
    assert db.execute('SELECT id, state FROM sc_keep.jobs ORDER BY id').fetchall() == [(1, "done"), (2, "done")]
    assert run(dsn, schema="sc_keep")[0].ok  # table recreated with queued rows, then schema dropped
    assert not schema_exists(dsn, "sc_keep")


@pytest.mark.parametrize("schema", ["public", "mine"])
def test_refuses_to_reuse_a_schema_it_did_not_create(dsn: str, db: psycopg.Connection, schema: str) -> None:
    db.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    db.execute(f"CREATE TABLE {schema}.jobs (id int)")
    result, text = run(dsn, schema=schema)
    assert not result.ok and result.steps == 0
    assert result.failures[0].step == 0 and "not a skiplock scenario scratch schema" in result.failures[0].got
    assert "scenario FAILED at step 0" in text
    assert db.execute(f"SELECT to_regclass('{schema}.jobs') IS NOT NULL").fetchone() == (True,)  # untouched
