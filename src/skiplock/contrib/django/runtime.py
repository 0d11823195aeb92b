"""The skiplock :class:`~skiplock.App` of a Django project: one per (database alias, schema), shared by
every thread (Django makes task backends per thread; the App and its connection pool are not).

Settings, from the first ``TASKS`` backend that is :class:`~skiplock.contrib.django.SkiplockBackend`
(its ``OPTIONS``), else ``settings.SKIPLOCK``: ``DATABASE`` (the alias whose connection jobs are
enqueued on and whose ``DATABASES`` entry gives skiplock's DSN; default ``"default"``), ``SCHEMA``
(default ``"skiplock"``) and ``QUEUES`` (the queues ``manage.py skiplock worker`` serves when it is
given none: the backend's ``QUEUES``).

``skiplock.contrib.django.runtime:app`` (what ``manage.py skiplock`` passes as ``--app``) is the
project's App with every installed app's ``tasks`` module imported, so a worker knows every task."""

from __future__ import annotations

import threading
from typing import Any

from ...app import App
from .connection import dsn_of

BACKEND_PATH = "skiplock.contrib.django.SkiplockBackend"
_apps: dict[tuple[str, str], App] = {}
_handlers: dict[str, Any] = {}  # skiplock task name -> handler, registered in every App (made before or after)
_lock = threading.Lock()


def register(name: str, handler: Any) -> None:
    """Register ``handler`` as skiplock task ``name`` in every project App, now and to come."""
    with _lock:
        if name in _handlers:
            return
        _handlers[name] = handler
        apps = list(_apps.values())
    for app in apps:
        app.task(name)(handler)


def options() -> dict[str, Any]:
    """skiplock's Django settings, defaults filled in: DATABASE, SCHEMA, QUEUES (None: every queue)."""
    from django.conf import settings

    found: dict[str, Any] = dict(getattr(settings, "SKIPLOCK", {}) or {})
    for params in (getattr(settings, "TASKS", {}) or {}).values():
        if params.get("BACKEND") == BACKEND_PATH:
            found = {**found, **params.get("OPTIONS", {})}
            if "QUEUES" in params and "QUEUES" not in found:
                found["QUEUES"] = list(params["QUEUES"])
            break
    return {"DATABASE": found.get("DATABASE", "default"), "SCHEMA": found.get("SCHEMA", "skiplock"),
            "QUEUES": found.get("QUEUES")}


def app_for(database: str = "default", schema: str = "skiplock") -> App:
    """The shared App on ``DATABASES[database]`` in ``schema`` (made on first use; nothing connects
    until the App is used)."""
    key = (database, schema)
    with _lock:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = App(dsn_of(database), schema=schema)
            for name, handler in _handlers.items():
                app.task(name)(handler)
        return app


def project_app() -> App:
    """The App of the project's settings, with every installed app's ``tasks`` module imported (each
    ``@task`` there registers its handler)."""
    from django.utils.module_loading import autodiscover_modules

    opts = options()
    app = app_for(opts["DATABASE"], opts["SCHEMA"])
    autodiscover_modules("tasks")
    return app


def fresh_app() -> App:
    """A new App of the project's settings (not the shared one), every ``tasks`` module imported and
    every Django task's handler registered: what ``manage.py skiplock`` runs (the CLI configures and
    closes the App it is given)."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    opts = options()
    app = App(dsn_of(opts["DATABASE"]), schema=opts["SCHEMA"])
    with _lock:
        handlers = dict(_handlers)
    for name, handler in handlers.items():
        app.task(name)(handler)
    return app


def close_all() -> None:
    """Close every App's connections (tests, and a process that is done with the queue)."""
    with _lock:
        apps = list(_apps.values())
        _apps.clear()
    for app in apps:
        app.close()


def __getattr__(name: str) -> Any:
    if name == "app":
        return project_app()
    if name == "cli_app":
        return fresh_app()
    raise AttributeError(name)
