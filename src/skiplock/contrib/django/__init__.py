"""skiplock for Django (psycopg 3 backend): docs/django.md.

- ``INSTALLED_APPS += ["skiplock.contrib.django"]``: ``manage.py skiplock ...`` (skiplock's command
  line on Django's settings) and a migration that installs skiplock's schema (``manage.py migrate``).
- ``TASKS = {"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend"}}``: the Django Tasks
  framework's ``@task`` functions enqueue into skiplock (:mod:`.backend`).
- :func:`enqueue` / :func:`enqueue_many`: skiplock's own enqueue on Django's connection, in its current
  transaction (inside ``transaction.atomic()`` the job exists only if the block commits).

Importing this package imports neither Django's ORM nor the Tasks framework (``SkiplockBackend`` is
loaded on first access), so it is safe in ``INSTALLED_APPS``."""

from __future__ import annotations

from typing import Any


def enqueue(task: str, args: Any = None, *, using: str | None = None, **options: Any) -> int:
    """``App.enqueue`` on Django's connection ``using`` (default: the configured ``DATABASE``), in its
    current transaction; the project's App (:mod:`.runtime`). Options are App.enqueue's."""
    from .connection import psycopg_connection
    from .runtime import app_for, options as settings_options

    opts = settings_options()
    alias = using or opts["DATABASE"]
    return app_for(alias, opts["SCHEMA"]).enqueue(task, args, conn=psycopg_connection(alias), **options)


def enqueue_many(jobs: Any, *, using: str | None = None) -> list[int]:
    """``App.enqueue_many`` on Django's connection ``using``, in its current transaction."""
    from .connection import psycopg_connection
    from .runtime import app_for, options as settings_options

    opts = settings_options()
    alias = using or opts["DATABASE"]
    return app_for(alias, opts["SCHEMA"]).enqueue_many(jobs, conn=psycopg_connection(alias))


def __getattr__(name: str) -> Any:
    if name == "SkiplockBackend":
        from .backend import SkiplockBackend

        return SkiplockBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
