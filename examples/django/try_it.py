"""Place orders through the real views (Django's test client: the whole request cycle, ATOMIC_REQUESTS
included) and print what happened, one JSON line per request. ``python try_it.py book declined fail:lamp``."""

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
import django  # noqa: E402

django.setup()
from django.test import Client  # noqa: E402

client = Client(raise_request_exception=False)
for arg in sys.argv[1:] or ["book"]:
    if arg.startswith("result:"):
        response = client.get(f"/results/{arg[7:]}")
    else:
        fail = arg.startswith("fail:")
        response = client.post("/orders", {"item": arg.removeprefix("fail:"), **({"fail": "1"} if fail else {})})
    body = response.json() if response["Content-Type"] == "application/json" else None
    print(json.dumps({"request": arg, "code": response.status_code, "body": body}))
