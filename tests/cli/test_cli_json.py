"""``--json`` on every command that prints data: exactly one JSON document on stdout, with the read
model's field names; a running job (a transaction-lease job whose handler runs now) carries its
task. And tables that stay whole in a pipe: no truncated id, name or timestamp, whatever the width."""

from __future__ import annotations

import json
import re

from cli_support import ok, one_json_document, run
from support import wait_for

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_every_data_command_prints_one_json_document(dsn, holding_worker):
    _, release = holding_worker
    held = int(ok(run(dsn, "enqueue", "hold", "--app", "cli_tasks:app", "--args",
                      json.dumps({"release": str(release)}))).stdout)
    queued = int(ok(run(dsn, "enqueue", "mail.send", "--app", "cli_tasks:app", "--args", '{"to": "a@x"}')).stdout)

    def running_in_status():
        doc = one_json_document(run(dsn, "status", "--json"))
        return doc if any(r["job_id"] == held for r in doc["running"]) else None

    status = wait_for(running_in_status, what="the held job shown running by status --json")
    (running,) = [r for r in status["running"] if r["job_id"] == held]
    assert running["task"] == "hold" and running["lease"] == "transaction", running
    assert ISO_UTC.match(running["since"]), running
    assert status["counts"]["default"]["running"] == 1 and status["counts"]["mail"]["queued"] == 1, status["counts"]
    assert [w["pid"] for w in status["workers"]] == [holding_worker[0].pid], status["workers"]

    listed = one_json_document(run(dsn, "jobs", "--state", "running", "--json"))
    assert [(j["id"], j["task"], j["state"]) for j in listed["jobs"]] == [(held, "hold", "running")], listed

    every = one_json_document(run(dsn, "jobs", "--json"))
    assert [j["id"] for j in every["jobs"]] == [queued, held] and every["next_before"] is None, every

    one = one_json_document(run(dsn, "jobs", str(queued), "--json"))
    assert (one["id"], one["task"], one["queue"], one["priority"], one["args"]) == \
        (queued, "mail.send", "mail", 3, {"to": "a@x"}), one
    assert ISO_UTC.match(one["created_at"]), one

    queues = one_json_document(run(dsn, "queues", "--json"))
    assert {q["queue"]: q["counts"]["queued"] for q in queues["queues"]} == {"default": 0, "mail": 1}, queues

    workers = one_json_document(run(dsn, "workers", "--json"))
    (worker,) = workers["workers"]
    assert worker["pid"] == holding_worker[0].pid and worker["running"] == 1 and "hold" in worker["tasks"], worker

    put = ok(run(dsn, "outbox", "put", "orders", "--payload", '{"n": 1}')).stdout.split()
    messages = one_json_document(run(dsn, "outbox", "--json"))
    assert [(m["id"], m["topic"], m["payload"], m["state"]) for m in messages["messages"]] == \
        [(int(put[0]), "orders", {"n": 1}, "pending")], messages
    message = one_json_document(run(dsn, "outbox", "show", put[0], "--json"))
    assert message["idempotency_key"] == put[1], message


def test_tables_in_a_pipe_keep_ids_names_and_timestamps_whole(dsn):
    long_task = "reports.monthly_revenue_by_region_and_currency"
    job_id = ok(run(dsn, "enqueue", long_task, "--queue", "a-rather-long-queue-name")).stdout.strip()
    listing = ok(run(dsn, "jobs", env={"COLUMNS": "40"})).stdout  # narrower than the table
    (row,) = [line for line in listing.splitlines() if job_id in line]
    assert long_task in row and "a-rather-long-queue-name" in row, listing
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row), listing
    detail = ok(run(dsn, "jobs", job_id, env={"COLUMNS": "40"})).stdout
    assert re.search(r"created_at\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", detail), detail


def test_workers_table_says_how_long_ago_a_worker_was_seen(dsn, holding_worker):
    def listed():
        out = ok(run(dsn, "workers")).stdout
        return out if str(holding_worker[0].pid) in out else None

    out = wait_for(listed, what="the worker listed")
    assert re.search(r"\b\d+ s ago\b", out), out
