"""Views. ATOMIC_REQUESTS: a view's jobs are enqueued in its transaction, so a view that fails after
enqueueing leaves no job behind (and no order)."""

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .models import Order
from .tasks import charge


@csrf_exempt
def place_order(request):
    order = Order.objects.create(item=request.POST["item"])
    result = charge.enqueue(order.id)
    if request.POST.get("fail"):
        raise RuntimeError("the view failed after enqueueing: the order and its job are rolled back")
    return JsonResponse({"order": order.id, "result_id": result.id, "status": result.status})


def result(request, result_id):
    res = charge.get_result(result_id)
    body = {"status": res.status, "errors": [e.exception_class_path for e in res.errors]}
    if res.status == "SUCCESSFUL":
        body["return_value"] = res.return_value
    return JsonResponse(body)
