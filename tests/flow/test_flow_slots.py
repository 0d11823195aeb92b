"""The claimed lease's slots (docs/flow-control.md, `release_stale_slots` in queries.sql): a
finishing write never waits to free a slot some claim holds locked; the rescuer's pass frees a slot
whose owner no running job has, and never one a running job owns, nor one it cannot lock."""

from __future__ import annotations

import uuid

import psycopg

import skiplock


def owned(db: psycopg.Connection, key: str) -> list:
    return [r[0] for r in db.execute("SELECT owner FROM skiplock.flow_slots WHERE key = %s ORDER BY n", [key])]


def test_the_rescuer_frees_only_the_slots_of_leases_that_ended(app: skiplock.App, db: psycopg.Connection, dsn: str):
    live, gone, locked = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    db.execute("INSERT INTO skiplock.jobs (queue, task, args, state, owner, lease_expires_at) "
               "VALUES ('q', 't', '{}', 'running', %s, now() + interval '1 hour')", [live])
    db.execute("INSERT INTO skiplock.flow_slots (key, n, owner) VALUES ('k', 1, %s), ('k', 2, %s), ('k', 3, %s)",
               [live, gone, locked])
    with psycopg.connect(dsn) as holder:  # a claim that holds slot 3 locked
        holder.execute("SELECT 1 FROM skiplock.flow_slots WHERE key = 'k' AND n = 3 FOR UPDATE")
        assert app.backend.release_stale_slots() == 1  # never waits on slot 3
        assert owned(db, "k") == [live, None, locked]
    assert app.backend.release_stale_slots() == 1  # unlocked now
    assert owned(db, "k") == [live, None, None]


def test_a_finishing_write_does_not_wait_for_a_locked_slot(app: skiplock.App, db: psycopg.Connection, dsn: str):
    @app.task("long", lease="claimed", concurrency=1)
    def long(job):
        pass

    job_id = app.enqueue("long")
    owner = uuid.uuid4()
    db.execute("UPDATE skiplock.jobs SET state = 'running', owner = %s, attempts = 1, "
               "lease_expires_at = now() + interval '1 hour' WHERE id = %s", [owner, job_id])
    db.execute("INSERT INTO skiplock.flow_slots (key, n, owner) VALUES ('[\"task\", \"long\"]', 1, %s)", [owner])
    claimed = app.backend.get_job(job_id)
    assert claimed["state"] == "running"
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM skiplock.flow_slots FOR UPDATE")
        holder.execute("SET lock_timeout = '5s'")
        with psycopg.connect(dsn, autocommit=True) as fin:  # the fenced finish, as the worker writes it
            fin.execute("SET lock_timeout = '2s'")
            rows = fin.execute(app.backend.q["complete_claimed"], {  # type: ignore[attr-defined]
                "id": job_id, "attempt": 1, "result": None, "started_at": None, "worker": "w", "owner": owner,
                "notice": "x"}).fetchone()
            assert rows[0] == 1  # done, without waiting for the locked slot
        assert owned(db, '["task", "long"]') == [owner]  # left for the rescuer
    assert app.backend.release_stale_slots() == 1
    assert owned(db, '["task", "long"]') == [None]


def test_a_batch_takes_one_slot_of_each_key_whatever_its_number_of_jobs(app: skiplock.App, dsn: str):
    """A batch's jobs run one after another (executor.py, ``_run_many``), so a batch holds one slot of
    each limited key its jobs have (``claim_flow`` in queries.sql): four jobs of one partition limited
    to 2 take one of its slots, and the queue limited to 3 loses one slot to the whole batch, not six."""
    @app.task("t", concurrency=2, partition_by="customer")
    def t(job, customer):
        pass

    app.set_queue_limits("default", concurrency=3)
    app.enqueue_many([("t", {"customer": c}) for c in "aaaabb"])
    keys = {'["task", "t", "a"]': 2, '["task", "t", "b"]': 2, '["queue", "default"]': 3}
    backend = app.backend
    limits = [skiplock.backend.base.TaskLimits("t", 2, "customer", None)]
    with backend.connect_bookkeeping() as book:
        backend.ensure_slots(book, list(keys.items()))
    with backend.connect_lease() as lease, psycopg.connect(dsn) as other:
        lease.begin()
        got = backend.claim_flow_many(lease, 6, ["default"], ["t"], limits)  # a limited queue: per queue
        assert len(got) == 6
        slots: dict[str, set[int]] = {}
        for _, flow_keys, _ in got:
            assert {k.key for k in flow_keys} == {'["task", "t", "a"]', '["queue", "default"]'} \
                or {k.key for k in flow_keys} == {'["task", "t", "b"]', '["queue", "default"]'}
            for k in flow_keys:
                assert k.slot is not None and k.slots_existing == keys[k.key]
                slots.setdefault(k.key, set()).add(k.slot)
        assert all(len(ns) == 1 for ns in slots.values()), slots  # one slot per key, shared by its jobs
        # every other slot is free for another lease: one of each partition, two of the queue
        free = other.execute("SELECT key, count(*) FROM skiplock.flow_slots WHERE owner IS NULL "
                             "GROUP BY key ORDER BY key").fetchall()
        locked_free = other.execute("SELECT key, count(*) FROM (SELECT key FROM skiplock.flow_slots "
                                    "FOR UPDATE SKIP LOCKED) f GROUP BY key ORDER BY key").fetchall()
        assert dict(free) == keys
        assert dict(locked_free) == {'["queue", "default"]': 2, '["task", "t", "a"]': 1, '["task", "t", "b"]': 1}
        lease.rollback()


def test_a_raised_limit_gets_its_new_slots_once_the_old_ones_are_all_taken(app: skiplock.App, db: psycopg.Connection):
    """A key's slot rows are created for its limit at the time (``ensure_slots``). A claim that takes
    a slot does not count the key's rows (``flow_slots_taken`` in queries.sql); one that finds none
    free does, and when fewer than the limit exist the worker creates the rest and claims again. So
    a limit raised from 2 to 4 runs 4 jobs at once: the third claim creates slots 3 and 4."""
    from skiplock.worker.bookkeeping import Bookkeeping
    from skiplock.worker.flow import FlowControl

    @app.task("t", concurrency=4)
    def t(job):
        pass

    key = '["task", "t"]'
    with app.backend.connect_bookkeeping() as book:
        app.backend.ensure_slots(book, [(key, 2)])  # the slots of the limit before it was raised
    app.enqueue_many([("t", {})] * 5)
    book = Bookkeeping(app.backend)
    leases = [app.backend.connect_lease(f"l{i}") for i in range(5)]
    try:
        taken = []
        for i, lease in enumerate(leases[:4]):
            jobs = FlowControl(app, None, False).claim(lease, book, slot=i, limit=1)
            assert len(jobs) == 1, (i, taken)
            taken.append(jobs[0].slots)
        assert sorted(taken) == [((key, n),) for n in (1, 2, 3, 4)]
        assert [r[0] for r in db.execute("SELECT n FROM skiplock.flow_slots WHERE key = %s ORDER BY n", [key])] \
            == [1, 2, 3, 4]
        assert FlowControl(app, None, False).claim(leases[4], book, slot=4, limit=1) == []  # 4 running: full
    finally:
        for lease in leases:
            lease.close()
