"""The Django app ``skiplock.contrib.django`` (label ``skiplock``)."""

from django.apps import AppConfig


class SkiplockConfig(AppConfig):
    name = "skiplock.contrib.django"
    label = "skiplock"
    verbose_name = "skiplock"
    default = True
