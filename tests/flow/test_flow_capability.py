"""Flow control where it cannot be exact (docs/flow-control.md): a backend without
``Capabilities.flow_control`` -- MySQL/MariaDB today, simulated here on the real PostgreSQL backend
by switching it off, as tests/integration/test_capabilities.py does for the other opt-outs -- refuses
limits and partitions with one clear error instead of running them unlimited; and the checks of the
options themselves."""

from __future__ import annotations

import dataclasses

import pytest

import skiplock
from skiplock.errors import ConfigurationError
from skiplock.flow import format_rate, parse_rate


def without_flow_control(app: skiplock.App) -> None:
    app.backend.capabilities = dataclasses.replace(app.backend.capabilities, flow_control=False)


def test_without_flow_control_limits_and_partitions_are_refused(app, db):
    without_flow_control(app)

    @app.task("limited", concurrency=2)
    def limited(job):
        pass

    with pytest.raises(ConfigurationError, match="not supported on MySQL/MariaDB yet"):
        app.worker(concurrency=1, handle_signals=False).run()
    with pytest.raises(ConfigurationError, match="partition is not supported on MySQL/MariaDB yet"):
        app.enqueue("limited", partition="customer:42")
    with pytest.raises(ConfigurationError, match="partition is not supported on MySQL/MariaDB yet"):
        app.enqueue_many([("limited", {}, {"partition": "customer:42"})])
    with pytest.raises(ConfigurationError, match="queue limits is not supported on MySQL/MariaDB yet"):
        app.set_queue_limits("default", concurrency=3)
    with pytest.raises(ConfigurationError, match="task limits is not supported on MySQL/MariaDB yet"):
        app.set_task_limits("limited", concurrency=3)
    assert app.task_limits() == []
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM skiplock.queue_limits").fetchone()[0] == 0
    assert app.queue_limits() == []


def test_without_flow_control_sequences_are_refused(app, db):
    without_flow_control(app)

    @app.task("sequenced", sequence_by="account")
    def sequenced(job, account):
        pass

    with pytest.raises(ConfigurationError, match="task sequences .*not supported on MySQL/MariaDB yet"):
        app.worker(concurrency=1, handle_signals=False).run()
    with pytest.raises(ConfigurationError, match="sequence is not supported on MySQL/MariaDB yet"):
        app.enqueue("sequenced", {"account": 1})
    with pytest.raises(ConfigurationError, match="sequence is not supported on MySQL/MariaDB yet"):
        app.enqueue("other", sequence="a")
    with pytest.raises(ConfigurationError, match="sequence is not supported on MySQL/MariaDB yet"):
        app.enqueue_many([("other", {}, {"sequence": "a"})])
    assert db.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0


def test_a_worker_that_claims_every_task_refuses_task_limits(app):
    @app.task("limited", rate="5/s")
    def limited(job):
        pass

    with pytest.raises(ConfigurationError, match="fail_unknown_tasks cannot be combined with task limits"):
        app.worker(concurrency=1, handle_signals=False, fail_unknown_tasks=True).run()


@pytest.mark.parametrize("text, parsed", [("100/min", (100, 60.0)), ("5/s", (5, 1.0)), ("1000/hour", (1000, 3600.0)),
                                          ("10/30s", (10, 30.0)), ("2/days", (2, 86400.0)), (" 7 / 2 min ", (7, 120.0))])
def test_rates_are_read(text, parsed):
    assert parse_rate(text) == parsed
    assert parse_rate(format_rate(*parsed)) == parsed


@pytest.mark.parametrize("bad", ["100", "100/fortnight", "0/min", "-1/s", "1.5/s", "1/0s", 100, "1/400day"])
def test_bad_rates_and_limits_are_refused_at_decoration(bad):
    app = skiplock.App("postgresql://nowhere.invalid/none")  # checked at decoration: never connects
    with pytest.raises(ConfigurationError, match="rate must"):
        app.task("t", rate=bad)
    for concurrency in (0, -1, True, 1.5, "2"):
        with pytest.raises(ConfigurationError, match="concurrency must"):
            app.task("t", concurrency=concurrency)
    with pytest.raises(ConfigurationError, match="partition_by must"):
        app.task("t", partition_by="")
