"""Django tasks of the tests (module level, as the framework requires)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from skiplock.contrib.django.compat import task

from .models import Order, Run


@task()
def record(label: str) -> str:
    Run.objects.create(label=label)
    return label


@task(priority=50)
def urgent(label: str) -> str:
    Run.objects.create(label=label)
    return label


@task(queue_name="other")
def elsewhere(label: str) -> str:
    Run.objects.create(label=label)
    return label


@task()
def charge(order_id: int) -> dict:
    order = Order.objects.get(pk=order_id)
    order.status = "charged"
    order.charged_at = timezone.now()
    order.details = {**order.details, "charged": True}
    order.save()
    return {"order": order_id, "item": order.details.get("sku"), "at_is_aware": timezone.is_aware(order.charged_at)}


@task()
def charge_then_fail(order_id: int) -> None:
    Order.objects.filter(pk=order_id).update(status="charged")
    raise ValueError(f"card declined for order {order_id}")


@task()
def savepoint_inside(order_id: int) -> str:
    Order.objects.filter(pk=order_id).update(status="outer")
    try:
        with transaction.atomic():
            Order.objects.filter(pk=order_id).update(item="inner")
            raise KeyError("undo the inner block")
    except KeyError:
        pass
    return Order.objects.get(pk=order_id).item


@task()
def commits_itself(order_id: int) -> None:
    Order.objects.filter(pk=order_id).update(status="charged")
    transaction.commit()


@task()
def durable_inside(order_id: int) -> None:
    with transaction.atomic(durable=True):
        Order.objects.filter(pk=order_id).update(status="charged")


@task()
def follow_up(order_id: int, fail: bool = False) -> int:
    result = record.enqueue(f"after {order_id}")
    if fail:
        raise RuntimeError("the follow-up job goes with me")
    return int(result.id)


@task(takes_context=True)
def with_context(context, label: str) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id, "label": label}


@task()
def iterate() -> list:
    """QuerySet.iterator(): a server-side cursor on the lease connection."""
    Order.objects.create(item="made in the job")
    return [o.item for o in Order.objects.order_by("id").iterator(chunk_size=1)]
