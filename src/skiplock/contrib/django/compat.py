"""The Django Tasks framework: ``django.tasks`` (Django 6+) or the ``django-tasks`` backport package
(Django 5.2 on Python 3.11). Everything skiplock uses of it is imported from here."""

from __future__ import annotations

try:  # Django 6.0+
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError, TaskResultDoesNotExist as ResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    FRAMEWORK = "django.tasks"
except ImportError:  # the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist as ResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    FRAMEWORK = "django_tasks"

__all__ = ["BaseTaskBackend", "FRAMEWORK", "InvalidTaskError", "ResultDoesNotExist", "Task", "TaskContext",
           "TaskError", "TaskResult", "TaskResultStatus", "task", "task_backends", "task_enqueued",
           "task_finished", "task_started"]
