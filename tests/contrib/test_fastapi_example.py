"""examples/fastapi through the real ASGI app (Starlette's TestClient runs its lifespan: migrate, the
worker, shutdown) on the real server: enqueue in the request's transaction, await a result, the
dashboard at /jobs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


from starlette.testclient import TestClient  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi" / "app.py"
TOKEN = "viewer-token-for-the-fastapi-example"


def load_example():
    spec = importlib.util.spec_from_file_location("fastapi_example_app", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fastapi_example(empty_dsn, db_on):
    api = load_example().create(empty_dsn, TOKEN)
    with TestClient(api) as client:  # the lifespan: migrate, create the table, start the worker
        made = client.post("/users", params={"name": "ann"})
        assert made.status_code == 200, made.text
        job_id = made.json()["job_id"]
        done = client.get(f"/results/{job_id}")
        assert done.json() == {"job_id": job_id, "result": {"welcomed": made.json()["user_id"]}}

        failed = client.post("/users", params={"name": "bob", "fail": "true"})
        assert failed.status_code == 500
        assert client.get("/results/999999").status_code == 404

        assert client.get("/jobs/").status_code == 401  # the dashboard is closed without its token
        page = client.get(f"/jobs/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"})
        assert page.status_code == 200 and "send_welcome" in page.text
        overview = client.get("/jobs/api/overview", headers={"Authorization": f"Bearer {TOKEN}"})
        assert overview.status_code == 200
    db = db_on(empty_dsn)
    assert db.execute("select name, welcomed from users").fetchall() == [("ann", True)]
    assert db.execute("select task, state from skiplock.jobs").fetchall() == [("send_welcome", "done")]
    assert db.execute("select count(*) from skiplock.workers").fetchone() == (0,)  # stopped by the lifespan
