"""open_backend picks the backend from the DSN's scheme; the App builds its backend only through it.
Nothing here connects: a backend connects at first use."""

from __future__ import annotations

import pytest

import skiplock
from skiplock.backend import open_backend
from skiplock.errors import ConfigurationError

SECRET = "s3cr3t-pass-word"


@pytest.mark.parametrize("dsn", [
    f"postgresql://u:{SECRET}@db.example/app",
    f"postgres://u:{SECRET}@db.example/app",
    f"POSTGRESQL://u:{SECRET}@db.example/app",
    f"host=db.example dbname=app password={SECRET}",
    "",  # libpq's defaults
])
def test_postgres_dsns_get_the_postgres_backend(dsn):
    backend = open_backend(dsn, "some_schema", lease_timeout=30, connect_timeout=3)
    assert type(backend).__name__ == "PostgresBackend"
    assert all(callable(getattr(backend, verb)) for verb in ("claim", "enqueue", "migrate", "close"))
    assert backend.schema == "some_schema" and backend.dsn == dsn
    assert backend.connect_timeout == 3 and backend.lease_timeout == 30
    assert SECRET not in repr(backend)


@pytest.mark.parametrize("dsn", [f"mysql://u:{SECRET}@db.example/app", f"mariadb://u:{SECRET}@db.example:3306/app"])
def test_mysql_dsns_get_the_mysql_backend(dsn):
    backend = open_backend(dsn, "some_schema", lease_timeout=30, connect_timeout=3)
    assert type(backend).__name__ == "MySQLBackend"
    assert backend.schema == "some_schema" and backend.dsn == dsn
    assert backend.connect_timeout == 3 and backend.lease_timeout == 30
    assert backend.capabilities.listen_notify is True  # wake-ups by polling notices (backend/mysql/notifications.py)
    assert SECRET not in repr(backend)


@pytest.mark.parametrize("dsn", [f"sqlite://u:{SECRET}@x/y", f"redis://:{SECRET}@cache:6379/0",
                                 f"http://u:{SECRET}@h/?password={SECRET}"])
def test_other_schemes_are_refused_naming_the_supported_ones(dsn):
    with pytest.raises(ConfigurationError) as caught:
        open_backend(dsn)
    message = str(caught.value)
    scheme = dsn.split("://")[0]
    assert f"unsupported DSN scheme {scheme!r}" in message
    assert "postgresql://" in message and "key=value" in message
    assert SECRET not in message


def test_the_app_builds_its_backend_through_open_backend():
    app = skiplock.App(f"mysql://u:{SECRET}@db.example/app")
    assert type(app.backend).__name__ == "MySQLBackend"
    assert SECRET not in repr(app) and SECRET not in repr(app.backend)


def test_redact_dsn_is_scheme_aware():
    from skiplock.errors import redact_dsn

    shown = redact_dsn(f"mysql://u:{SECRET}@db.example:3306/app?ssl=1&password={SECRET}")
    assert SECRET not in shown and shown.startswith("mysql://u@db.example:3306/app") and "ssl=1" in shown
    assert sorted(redact_dsn(f"host=h password={SECRET} dbname=d").split()) == ["dbname=d", "host=h"]


def test_redact_finds_the_password_of_any_schemes_dsn_in_free_text():
    from skiplock.errors import redact

    for dsn in (f"mysql://u:{SECRET}@db.example/app", f"postgresql://u:{SECRET}@db.example/app",
                f"host=h password={SECRET}"):
        assert SECRET not in redact(f"the server said: bad login {SECRET!r}", dsn)


def test_the_readiness_probe_is_the_dsns_backends():
    """A DSN no backend serves is never probed as an outage (None: nothing to wait for)."""
    from skiplock.backend.probes import answers

    assert answers(f"sqlite://u:{SECRET}@db.example/app") is None
    # MySQL's probe: a closed port is "not there" (an outage to wait for), a DSN without a database
    # cannot be probed
    assert answers(f"mysql://u:{SECRET}@127.0.0.1:1/app") is False
    assert answers(f"mariadb://u:{SECRET}@127.0.0.1:1/") is None
