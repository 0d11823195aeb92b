"""skiplock.contrib.django against real Django (the Tasks framework, the ORM, transaction.atomic) on the
real server: enqueue in Django's transaction, the framework's backend contract (priorities, run_after,
queues, results), and ORM writes in a handler committing with the job."""

from __future__ import annotations

from datetime import timedelta

import pytest



def drain(queues=None) -> None:
    from skiplock.contrib.django.runtime import app_for

    app_for("default").worker(queues=queues, concurrency=1, handle_signals=False, poll_interval=0.05,
                              maintenance=False).run(stop_when_empty=True)


def jobs(db) -> list[tuple]:
    return db.execute("select task, queue, state from skiplock.jobs order by id").fetchall()


# ---- enqueue in Django's transaction ------------------------------------------------------------


def test_a_job_enqueued_in_atomic_exists_only_if_the_block_commits(django_db):
    from django.db import transaction

    from django_testapp.models import Order
    from django_testapp.tasks import charge

    with transaction.atomic():
        order = Order.objects.create(item="book")
        kept = charge.enqueue(order.id)
        # not committed yet: another session sees neither the order nor the job
        assert django_db.execute("select count(*) from skiplock.jobs").fetchone() == (0,)
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            lost = Order.objects.create(item="lamp")
            charge.enqueue(lost.id)
            raise RuntimeError("the view failed")
    assert jobs(django_db) == [("django_testapp.tasks.charge", "default", "queued")]
    assert kept.id == str(django_db.execute("select id from skiplock.jobs").fetchone()[0])
    assert django_db.execute("select item from django_orders").fetchall() == [("book",)]


def test_skiplock_enqueue_on_djangos_connection_follows_the_savepoint(django_db):
    from django.db import transaction

    from skiplock.contrib.django import enqueue

    with transaction.atomic():
        enqueue("plain_task", {"n": 1})
        try:
            with transaction.atomic():  # a savepoint: rolled back alone
                enqueue("plain_task", {"n": 2})
                raise KeyError
        except KeyError:
            pass
    assert django_db.execute("select args from skiplock.jobs").fetchall() == [({"n": 1},)]


# ---- the backend contract: priorities, run_after, queues, results -----------------------------


def test_the_backend_declares_what_it_supports(django_dsn):  # Django set up, whatever ran before
    from skiplock.contrib.django.compat import task_backends

    backend = task_backends["default"]
    assert (backend.supports_defer, backend.supports_priority, backend.supports_get_result,
            backend.supports_async_task) == (True, True, True, False)


def test_higher_priority_runs_first(django_db):
    from django_testapp.tasks import record, urgent

    record.enqueue("normal")
    record.using(priority=-20).enqueue("low")
    urgent.enqueue("urgent")
    assert django_db.execute("select priority from skiplock.jobs order by id").fetchall() == [(0,), (20,), (-50,)]
    drain()
    assert [r for (r,) in django_db.execute("select label from django_runs order by id")] == ["urgent", "normal", "low"]


def test_run_after_defers_the_task(django_db):
    from django.utils import timezone

    from django_testapp.tasks import record

    later = record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    now = record.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue("now")
    drain()
    later.refresh()
    now.refresh()
    assert (later.status, now.status) == ("READY", "SUCCESSFUL")
    assert [r for (r,) in django_db.execute("select label from django_runs")] == ["now"]


def test_run_after_must_be_aware(django_dsn):  # Django set up (alone in its test process, it was not)
    from datetime import datetime

    from skiplock.contrib.django.compat import InvalidTaskError
    from django_testapp.tasks import record

    with pytest.raises(InvalidTaskError):
        record.using(run_after=datetime(2030, 1, 1)).enqueue("naive")


def test_queues_are_skiplock_queues_and_unknown_ones_are_refused(django_db):
    from skiplock.contrib.django.compat import InvalidTaskError
    from django_testapp.tasks import elsewhere, record

    elsewhere.enqueue("other queue")
    record.enqueue("default queue")
    with pytest.raises(InvalidTaskError):
        record.using(queue_name="nowhere")
    drain(queues=["default"])
    assert [r for (r,) in django_db.execute("select label from django_runs")] == ["default queue"]
    assert [q for _, q, _ in jobs(django_db)] == ["other", "default"]


def test_results_report_skiplock_state_result_and_errors(django_db):
    from skiplock.contrib.django.compat import ResultDoesNotExist, TaskResultStatus, task_backends
    from django_testapp.models import Order
    from django_testapp.tasks import charge, charge_then_fail

    ok = charge.enqueue(Order.objects.create(item="book", details={"sku": "B-1"}).id)
    bad = charge_then_fail.enqueue(Order.objects.create(item="lamp").id)
    assert (ok.status, ok.is_finished, ok.args, ok.backend) == (TaskResultStatus.READY, False, [1], "default")
    with pytest.raises(ValueError):
        ok.return_value
    drain()
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.is_finished
    assert ok.return_value == {"order": 1, "item": "B-1", "at_is_aware": True}
    assert ok.attempts == 1 and ok.started_at is not None and ok.finished_at >= ok.started_at
    failed = charge_then_fail.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [ValueError]
    assert "card declined for order 2" in failed.errors[0].traceback
    with pytest.raises(ValueError):
        failed.return_value
    with pytest.raises(ResultDoesNotExist):
        task_backends["default"].get_result("999999")
    with pytest.raises(ResultDoesNotExist):
        task_backends["default"].get_result("not-an-id")


def test_a_task_taking_context_gets_its_attempt(django_db):
    from django_testapp.tasks import with_context

    result = with_context.enqueue(label="x")
    drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "label": "x"}


def test_aenqueue_and_aget_result(django_db):
    import asyncio

    from django_testapp.tasks import record

    async def go():
        result = await record.aenqueue("async")
        return await record.aget_result(result.id)

    assert asyncio.run(go()).status == "READY"


# ---- ORM writes in a handler commit with the job (the transaction lease) ------------------------


def test_orm_writes_in_a_handler_commit_with_the_job_or_not_at_all(django_db):
    from django_testapp.models import Order
    from django_testapp.tasks import charge, charge_then_fail

    good = Order.objects.create(item="book")
    bad = Order.objects.create(item="lamp")
    charge.enqueue(good.id)
    charge_then_fail.enqueue(bad.id)
    drain()
    rows = dict(django_db.execute("select item, status from django_orders").fetchall())
    assert rows == {"book": "charged", "lamp": "new"}  # the failed job's update was rolled back with it
    # the handler's writes ran in the job's own transaction: the same backend pid wrote both
    assert [s for _, _, s in jobs(django_db)] == ["done", "failed"]


def test_atomic_inside_a_handler_is_a_savepoint(django_db):
    from django_testapp.models import Order
    from django_testapp.tasks import savepoint_inside

    result = savepoint_inside.enqueue(Order.objects.create(item="book").id)
    drain()
    result.refresh()
    assert result.return_value == "book"  # the inner block was undone alone
    assert django_db.execute("select item, status from django_orders").fetchall() == [("book", "outer")]


@pytest.mark.parametrize("task_name", ["commits_itself", "durable_inside"])
def test_a_handler_cannot_commit_the_lease(django_db, task_name):
    from django_testapp import tasks
    from django_testapp.models import Order

    result = getattr(tasks, task_name).enqueue(Order.objects.create(item="book").id)
    drain()
    result.refresh()
    assert result.status == "FAILED"
    assert result.errors[0].exception_class.__name__ in ("TransactionManagementError", "RuntimeError")
    assert django_db.execute("select status from django_orders").fetchall() == [("new",)]


def test_a_job_enqueued_by_a_handler_commits_with_it(django_db):
    from django_testapp.tasks import follow_up

    follow_up.enqueue(1)
    follow_up.enqueue(2, fail=True)
    drain()
    labels = [r for (r,) in django_db.execute("select label from django_runs")]
    assert labels == ["after 1"]  # the failed handler's follow-up job was rolled back with it
    assert [(t.rsplit(".", 1)[1], s) for t, _, s in jobs(django_db)] == [
        ("follow_up", "done"), ("follow_up", "failed"), ("record", "done")]


def test_a_server_side_cursor_in_a_handler_reads_the_jobs_own_writes(django_db):
    from django_testapp.models import Order
    from django_testapp.tasks import iterate

    Order.objects.create(item="before")
    result = iterate.enqueue()
    drain()
    result.refresh()
    assert result.return_value == ["before", "made in the job"]


def test_args_that_are_not_json_are_refused_before_anything_is_sent(django_db):
    from django.db import transaction

    from skiplock.errors import InvalidJob
    from django_testapp.models import Order
    from django_testapp.tasks import record

    with transaction.atomic():
        with pytest.raises(InvalidJob):
            record.enqueue(object())
        Order.objects.create(item="still usable")  # the transaction was not touched
    assert jobs(django_db) == []
    assert django_db.execute("select item from django_orders").fetchall() == [("still usable",)]


def test_a_job_that_is_no_django_tasks_has_no_result(django_db):
    from skiplock.contrib.django import enqueue
    from skiplock.contrib.django.compat import ResultDoesNotExist, task_backends

    job_id = enqueue("plain_task", {"n": 1})
    with pytest.raises(ResultDoesNotExist):
        task_backends["default"].get_result(str(job_id))
