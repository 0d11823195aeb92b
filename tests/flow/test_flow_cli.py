"""Per-queue limits from the command line (docs/flow-control.md, docs/cli.md): ``skiplock limit``
changes a running worker's limit live, without a restart; ``limits`` and ``queues`` show them (and
``--json``); bad input is one line on stderr and exit 2, nothing changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from support import run_cli, wait_for

import skiplock

HERE = Path(__file__).resolve().parent
JOBS, FIRST = 24, 8

OVERLAP = """
SELECT coalesce(max(n), 0) FROM (
  SELECT (SELECT count(*) FROM flow_runs o WHERE o.started <= r.started AND o.ended > r.started) AS n
    FROM flow_runs r WHERE %(since)s::timestamptz IS NULL OR r.started >= %(since)s) x"""


def cli(dsn: str, *args: str) -> Any:
    return run_cli(dsn, *args, cwd=HERE)


def done(db: psycopg.Connection[Any]) -> int:
    return db.execute("SELECT count(*) FROM flow_runs").fetchone()[0]


def test_limit_changes_a_running_workers_limit_without_restart(dsn: str, runs: psycopg.Connection[Any],
                                                               spawn: Any) -> None:
    assert cli(dsn, "limit", "flow", "--concurrency", "1").returncode == 0
    for _ in range(2):
        spawn.worker(dsn, concurrency=3, env={"FLOW_SECONDS": "0.1"})
    with skiplock.App(dsn) as producer:
        producer.enqueue_many([("plain", {"n": i}, {"queue": "flow"}) for i in range(FIRST)])
        wait_for(lambda: done(runs) == FIRST, timeout=60, what="the first jobs done at concurrency 1")
        assert runs.execute(OVERLAP, {"since": None}).fetchone()[0] == 1  # 6 slots, one job at a time
        changed = cli(dsn, "limit", "flow", "--concurrency", "3")  # the same workers run on
        assert changed.returncode == 0, changed.stderr
        since = runs.execute("SELECT clock_timestamp()").fetchone()[0]
        producer.enqueue_many([("plain", {"n": i}, {"queue": "flow"}) for i in range(FIRST, JOBS)])
    wait_for(lambda: done(runs) == JOBS, timeout=60, what="every job done")
    assert 2 <= runs.execute(OVERLAP, {"since": since}).fetchone()[0] <= 3  # the new limit, honoured live
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == JOBS


def test_limits_are_shown_and_changed_by_option(dsn: str) -> None:
    assert cli(dsn, "limit", "api", "--rate", "100/min").returncode == 0
    out = cli(dsn, "limit", "api", "--concurrency", "4", "--json")
    assert json.loads(out.stdout) == {"queue": "api", "concurrency": 4, "rate": "100/min", "fair": False,
                                      "weights": {}}  # rate kept
    listed = json.loads(cli(dsn, "limits", "--json").stdout)["limits"]
    assert [(q["queue"], q["concurrency"], q["rate"], q["rate_count"], q["rate_period"]) for q in listed] == [
        ("api", 4, "100/min", 100, 60.0)]
    queues = json.loads(cli(dsn, "queues", "--json").stdout)["queues"]
    assert [(q["queue"], q["limits"]) for q in queues] == [("api", {"concurrency": 4, "rate": "100/min", "fair": False,
                                                                   "weights": {}})]
    table = cli(dsn, "queues").stdout
    assert "concurrency 4, 100/min" in table
    assert cli(dsn, "limit", "api", "--rate", "none").returncode == 0
    assert json.loads(cli(dsn, "limits", "--json").stdout)["limits"][0]["rate"] is None
    cleared = cli(dsn, "limit", "api", "--clear")
    assert cleared.returncode == 0 and "no limits" in cleared.stdout
    assert json.loads(cli(dsn, "limits", "--json").stdout)["limits"] == []


BAD = [
    (("--concurrency", "0"), "concurrency must be a whole number from 1 to 100000"),
    (("--concurrency", "many"), "--concurrency must be a whole number"),
    (("--rate", "lots"), "rate must look like '100/min'"),
    (("--rate", "0/min"), "at least 1 start"),
    ((), "nothing to change"),
    (("--clear", "--rate", "1/s"), "not both"),
    (("--clear", "--fair"), "not both"),
    (("--weight", "a=2"), "--weight applies to a fair queue"),
    (("--fair", "--weight", "a"), "--weight must look like PARTITION=N"),
    (("--fair", "--weight", "a=x"), "the weight must be a whole number"),
    (("--fair", "--weight", "a=0"), "must be a whole number from 1 to 1000"),
    (("--task", "t"), "give a QUEUE or --task NAME"),
]


def test_bad_limits_are_refused_with_one_line_and_exit_2(dsn: str) -> None:
    for args, message in BAD:
        result = cli(dsn, "limit", "api", *args)
        assert result.returncode == 2, (args, result)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    assert json.loads(cli(dsn, "limits", "--json").stdout)["limits"] == []  # nothing changed


def test_weights_are_set_shown_and_reset_by_option(dsn: str) -> None:
    out = cli(dsn, "limit", "tenants", "--fair", "--weight", "customer:42=3", "--weight", "b=2", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["weights"] == {"customer:42": 3, "b": 2}
    assert cli(dsn, "limit", "tenants", "--weight", "b=none").returncode == 0  # the others kept
    assert json.loads(cli(dsn, "limits", "--json").stdout)["limits"][0]["weights"] == {"customer:42": 3}
    assert "fair (customer:42=3)" in cli(dsn, "limits").stdout
    assert "fair (customer:42=3)" in cli(dsn, "queues").stdout


def test_task_limits_are_set_shown_and_cleared(dsn: str) -> None:
    assert cli(dsn, "limit", "--task", "plain", "--rate", "5/s").returncode == 0
    out = cli(dsn, "limit", "--task", "plain", "--concurrency", "2", "--json")
    assert json.loads(out.stdout) == {"task": "plain", "concurrency": 2, "rate": "5/s", "cleared": False}
    listed = json.loads(cli(dsn, "limits", "--json").stdout)["task_limits"]
    assert [(t["task"], t["concurrency"], t["rate"]) for t in listed] == [("plain", 2, "5/s")]
    assert json.loads(cli(dsn, "queues", "--json").stdout)["task_limits"][0]["task"] == "plain"
    assert "plain: concurrency 2, 5/s" in cli(dsn, "queues").stdout
    for args, message in [(("--fair",), "--fair and --weight are a queue's"), ((), "nothing to change"),
                          (("--concurrency", "0"), "concurrency must be a whole number")]:
        result = cli(dsn, "limit", "--task", "plain", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    cleared = cli(dsn, "limit", "--task", "plain", "--clear")
    assert cleared.returncode == 0 and "the limits in its code" in cleared.stdout
    assert json.loads(cli(dsn, "limits", "--json").stdout)["task_limits"] == []


def test_a_task_limit_set_at_runtime_binds_running_workers(dsn: str, runs: psycopg.Connection[Any],
                                                          spawn: Any) -> None:
    # `plain` has no limit in its code: the runtime limit moves it to the flow claim, live
    assert cli(dsn, "limit", "--task", "plain", "--concurrency", "1").returncode == 0
    for _ in range(2):
        spawn.worker(dsn, concurrency=3, env={"FLOW_SECONDS": "0.1"})
    with skiplock.App(dsn) as producer:
        producer.enqueue_many([("plain", {"n": i}, {"queue": "flow"}) for i in range(FIRST)])
        wait_for(lambda: done(runs) == FIRST, timeout=60, what="the first jobs done at concurrency 1")
        assert runs.execute(OVERLAP, {"since": None}).fetchone()[0] == 1  # 6 slots, one job at a time
        assert cli(dsn, "limit", "--task", "plain", "--concurrency", "3").returncode == 0  # the same workers run on
        since = runs.execute("SELECT clock_timestamp()").fetchone()[0]
        producer.enqueue_many([("plain", {"n": i}, {"queue": "flow"}) for i in range(FIRST, JOBS)])
    wait_for(lambda: done(runs) == JOBS, timeout=60, what="every job done")
    assert 2 <= runs.execute(OVERLAP, {"since": since}).fetchone()[0] <= 3  # the new limit, honoured live
    assert runs.execute("SELECT count(DISTINCT job_id) FROM flow_runs").fetchone()[0] == JOBS
