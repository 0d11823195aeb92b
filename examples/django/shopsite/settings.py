"""Settings of the example project. The database is the libpq DSN in SKIPLOCK_EXAMPLE_DSN (for example
the one ``skiplock server start`` prints), turned into Django's DATABASES entry."""

import os

from psycopg import conninfo

dsn = conninfo.conninfo_to_dict(os.environ["SKIPLOCK_EXAMPLE_DSN"])

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shopsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["skiplock.contrib.django", "shop"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dsn.pop("dbname"),
        "USER": dsn.pop("user", ""),
        "PASSWORD": dsn.pop("password", ""),
        "HOST": dsn.pop("host", ""),
        "PORT": dsn.pop("port", ""),
        "OPTIONS": dsn,  # the rest of the DSN: passfile, sslmode, ...
        "ATOMIC_REQUESTS": True,  # each view runs in a transaction: its jobs exist only if it succeeds
    }
}

TASKS = {
    "default": {
        "BACKEND": "skiplock.contrib.django.SkiplockBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"DATABASE": "default", "SCHEMA": "skiplock", "MAX_ATTEMPTS": 2},
    }
}

LOGGING = {"version": 1, "disable_existing_loggers": False}
