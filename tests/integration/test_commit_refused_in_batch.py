"""A COMMIT the server refuses in a batch (a deferred constraint one handler broke): no batch-mate
is charged, and the job that broke it ends with that error, not with "gave up: none finished"."""

from __future__ import annotations

from test_batches import run_until_empty, whole


def test_a_batched_job_whose_commit_is_refused_fails_with_that_error(app, db):
    db.execute("CREATE TABLE parents (id int PRIMARY KEY)")
    db.execute("CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)")

    @app.task(name="child", max_attempts=2, retry=0)
    def child(job, parent):
        job.conn.execute("INSERT INTO children VALUES (%s)", [parent])  # checked only at COMMIT

    ids = app.enqueue_many([("child", {"parent": None}), ("child", {"parent": 42}), ("child", {"parent": None})])
    run_until_empty(app, concurrency=1, batch_policy=whole(4), poll_interval=0.02)
    good, bad, other = (app.get_job(i) for i in ids)
    assert (good.state, good.attempts, other.state, other.attempts) == ("done", 1, "done", 1)
    assert (bad.state, bad.attempts) == ("failed", 2), bad
    assert bad.last_error.startswith("ForeignKeyViolation"), bad.last_error
    assert [e["error"].split(":")[0] for e in bad.errors] == ["ForeignKeyViolation", "ForeignKeyViolation"]
    assert db.execute("SELECT count(*) FROM children").fetchone()[0] == 2  # the batch-mates' rows, once
    # no batch row names a job any more (the dead batches' rows are left empty, for the pruner)
    assert db.execute("SELECT count(*) FROM skiplock.job_batches WHERE cardinality(ids) > 0").fetchone()[0] == 0
