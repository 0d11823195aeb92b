"""The shop's tasks. Each runs in its job's transaction: the ORM writes here commit with the job."""

from django.db import transaction
from django.utils import timezone

from skiplock.contrib.django.compat import task  # django.tasks on Django 6, the django-tasks backport on 5.2

from .models import Email, Order


@task(priority=10)
def charge(order_id: int) -> dict:
    order = Order.objects.select_for_update().get(pk=order_id)
    if order.item == "declined":
        raise ValueError(f"card declined for order {order_id}")
    order.status, order.charged_at = "charged", timezone.now()
    order.save()
    send_receipt.enqueue(order_id)  # a follow-up job: it exists only if this one commits
    return {"order": order_id, "status": order.status}


@task(queue_name="emails")
def send_receipt(order_id: int) -> int:
    with transaction.atomic():  # inside a handler: a savepoint in the job's transaction
        email = Email.objects.create(order_id=order_id, text=f"receipt for order {order_id}")
    return email.id
