"""Hostile outcomes: every outcome a handler can produce is stored, or ends the attempt with a
recorded error saying what was wrong -- never a lost connection, a reconnect or a re-run of its
batch-mates. And a snooze never uses up an attempt, in either lease mode."""

from __future__ import annotations

import pytest

from skiplock import Cancel, Retry, Snooze

from test_batches import whole  # claims are whole batches from the start

INF, NAN = float("inf"), float("nan")


def run_until_empty(app, **options):
    options = {"handle_signals": False, "maintenance": False, "concurrency": 1, "batch_budget": 60, **options}
    return app.worker(**options).run(stop_when_empty=True)


# ---- item 7: a snooze is not an attempt, in both lease modes ---------------------------------------------


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_snoozes_never_use_up_attempts_in_either_lease_mode(app, lease):
    seen = []  # job.attempt as each run saw it

    @app.task(name="sleepy", max_attempts=2, retry=0, lease=lease)
    def sleepy(job):
        seen.append(job.attempt)
        if len(seen) <= 3:
            raise Snooze(0)
        if len(seen) == 4:
            raise RuntimeError("fails once")
        return "ok"

    @app.task(name="later", max_attempts=2, lease=lease)
    def later(job):
        return Snooze(3600)

    job_id, later_id = app.enqueue("sleepy"), app.enqueue("later")
    stats = run_until_empty(app)
    assert seen == [1, 1, 1, 1, 2]  # three snoozes, then attempt 1 fails, attempt 2 succeeds
    job = app.get_job(job_id)
    assert (job.state, job.attempts, job.result) == ("done", 2, "ok")
    assert (stats.snoozed, stats.retried, stats.done, stats.reconnects) == (4, 1, 1, 0)
    snoozed = app.get_job(later_id)
    assert (snoozed.state, snoozed.attempts) == ("queued", 0)


def test_snoozes_in_a_batch_never_use_up_attempts_either(app):
    seen: dict[int, list[int]] = {}

    @app.task(name="sleepy", max_attempts=2, retry=0)
    def sleepy(job):
        runs = seen.setdefault(job.id, [])
        runs.append(job.attempt)
        if len(runs) <= 3:
            raise Snooze(0)
        if len(runs) == 4:
            raise RuntimeError("fails once")
        return "ok"

    ids = app.enqueue_many([("sleepy", {})] * 4)
    stats = run_until_empty(app, batch_policy=whole(4))
    assert seen == {i: [1, 1, 1, 1, 2] for i in ids}
    assert [(j.state, j.attempts) for j in map(app.get_job, ids)] == [("done", 2)] * 4
    assert stats.reconnects == 0


# ---- item 8: unstorable outcomes end with a clear recorded error -------------------------------------------


class Unserialisable:
    pass


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


def _policy_inf(attempt, error):
    return INF


# name -> (handler body, task options, expected state, phrases the recorded error must contain)
HOSTILE = {
    "returns_nul": (lambda job: "a\x00b", {}, "failed", ["result not storable", "NUL"]),
    "returns_surrogate": (lambda job: {"k": "\ud800"}, {}, "failed", ["result not storable", "surrogate"]),
    "returns_surrogate_key": (lambda job: {"\udcff": 1}, {}, "failed", ["result not storable", "surrogate"]),
    "returns_nan": (lambda job: [NAN], {}, "failed", ["result not storable", "NaN"]),
    "returns_object": (lambda job: Unserialisable(), {}, "failed", ["result not storable", "not JSON-serialisable"]),
    "raises_nul_and_surrogate": (lambda job: _raise(RuntimeError("bad\x00byte \ud800 here")), {}, "failed",
                                 ["RuntimeError: bad\\x00byte \\ud800 here"]),
    "retry_inf": (lambda job: _raise(Retry(in_=INF)), {}, "failed", ["Retry(in_=...)", "inf"]),
    "retry_nan": (lambda job: _raise(Retry(in_=NAN)), {}, "failed", ["Retry(in_=...)", "nan"]),
    "retry_huge": (lambda job: _raise(Retry(in_=1e300)), {}, "failed", ["Retry(in_=...)", "1e+300"]),
    "snooze_inf": (lambda job: _raise(Snooze(INF)), {}, "failed", ["Snooze(seconds)", "inf"]),
    "snooze_nan": (lambda job: Snooze(NAN), {}, "failed", ["Snooze(seconds)", "nan"]),
    "snooze_huge": (lambda job: _raise(Snooze(1e300)), {}, "failed", ["Snooze(seconds)", "1e+300"]),
    "policy_inf": (lambda job: _raise(RuntimeError("boom")), {"retry": _policy_inf, "max_attempts": 3}, "failed",
                   ["RuntimeError: boom", "retry policy", "inf"]),
    "raises_unprintable": (lambda job: _raise(Unprintable()), {}, "failed", ["Unprintable: <str() failed"]),
    "cancel_nul": (lambda job: _raise(Cancel("why\x00not \ud800")), {}, "cancelled", ["why\\x00not \\ud800"]),
}


def _raise(exc):
    raise exc


def register_hostile(app, lease, runs):
    for name, (body, options, _, _) in HOSTILE.items():
        def handler(job, _body=body):
            runs.append((job.id, job.conn.info.backend_pid))
            return _body(job)

        app.task(name=name, lease=lease, **{"max_attempts": 1, **options})(handler)


def check_recorded(app, ids):
    for name, job_id in ids.items():
        _, _, state, phrases = HOSTILE[name]
        job = app.get_job(job_id)
        assert job.state == state, (name, job.state, job.last_error)
        for phrase in phrases:
            assert phrase in (job.last_error or ""), (name, phrase, job.last_error)
        assert "worker process died" not in job.last_error, (name, job.last_error)


@pytest.mark.parametrize("lease", ["transaction", "claimed"])
def test_every_hostile_outcome_ends_with_a_clear_recorded_error(app, lease):
    runs = []
    register_hostile(app, lease, runs)
    ids = {name: app.enqueue(name) for name in HOSTILE}
    stats = run_until_empty(app)
    check_recorded(app, ids)
    assert sorted(job_id for job_id, _ in runs) == sorted(ids.values())  # each ran exactly once
    assert len({pid for _, pid in runs}) == 1  # one lease connection throughout: never reconnected
    assert stats.reconnects == 0


def test_hostile_outcomes_in_a_batch_leave_their_batch_mates_alone(app):
    runs = []
    register_hostile(app, "transaction", runs)
    xacts = {}

    @app.task(name="good")
    def good(job, n):
        runs.append((job.id, job.conn.info.backend_pid))
        xacts[job.id] = job.conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        return n

    items = []
    for n, name in enumerate(HOSTILE):  # every hostile job between two well-behaved ones
        items += [("good", {"n": 2 * n}), (name, {}), ("good", {"n": 2 * n + 1})]
    job_ids = app.enqueue_many(items)
    stats = run_until_empty(app, batch_policy=whole(len(items)))
    ids = {name: job_ids[3 * n + 1] for n, name in enumerate(HOSTILE)}
    check_recorded(app, ids)
    assert sorted(job_id for job_id, _ in runs) == sorted(job_ids)  # every job ran exactly once
    assert len(set(xacts.values())) == 1  # all in one batch's transaction, which committed
    assert len({pid for _, pid in runs}) == 1 and stats.reconnects == 0
    good_ids = [i for i in job_ids if i not in ids.values()]
    assert [app.get_job(i).result for i in good_ids] == list(range(len(good_ids)))
    assert stats.done == len(good_ids)
