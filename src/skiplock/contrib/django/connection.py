"""Django's database connection and skiplock's, both ways (psycopg 3 backend only).

- :func:`psycopg_connection`: the ``psycopg.Connection`` under Django's connection of an alias, so
  ``app.enqueue(..., conn=...)`` runs in Django's current transaction: inside
  ``transaction.atomic()`` (or a request under ``ATOMIC_REQUESTS``) the job exists only if the block
  commits; in autocommit mode the insert commits at once, like any Django query there.
- :func:`bound_to_lease`: while a handler runs, this thread's Django connection of the alias *is*
  the job's lease connection (``job.conn``), so ORM queries run in the job's transaction and commit
  with the job's completion, or not at all. Django is told it is inside an atomic block it does not
  own: ``transaction.atomic()`` in the handler is a savepoint, ``transaction.commit()`` /
  ``rollback()`` / ``set_autocommit()`` raise ``TransactionManagementError`` (the commit is
  skiplock's), ``atomic(durable=True)`` raises ``RuntimeError``, and ``on_commit`` callbacks
  registered in the handler are dropped, with a warning (the handler's commit is not Django's; enqueue
  a job instead, which commits with this one). One alias only: other aliases are other sessions.
- :func:`dsn_of`: the libpq DSN of ``DATABASES[alias]``, for skiplock's own connections.

PostgreSQL-specific by design (tests/unit/test_import_contract.py, DRIVER_BY_DESIGN)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import psycopg
from psycopg import conninfo, postgres
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format

from ...errors import ConfigurationError

log = logging.getLogger("skiplock.contrib.django")

# get_connection_params() keys that are Django's or psycopg's, not libpq's
_NOT_LIBPQ = ("context", "cursor_factory", "prepare_threshold", "assume_role", "pool", "server_side_binding",
              "isolation_level")
# Django's adapters template (django.db.backends.postgresql.psycopg_any.get_adapters_template) differs
# from psycopg's defaults in the loaders of these types; a cursor on the lease connection gets them.
_DJANGO_LOADED_TYPES = ("jsonb", "inet", "cidr", "timestamptz")


def _wrapper(using: str) -> Any:
    from django.db import connections

    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise ConfigurationError(f"skiplock needs a PostgreSQL database; DATABASES[{using!r}] is {wrapper.vendor}")
    return wrapper


def psycopg_connection(using: str = "default") -> "psycopg.Connection[Any]":
    """The psycopg 3 connection under Django's connection ``using`` in this thread (connecting it if
    needed); under a handler's lease, the lease connection."""
    wrapper = _wrapper(using)
    wrapper.ensure_connection()
    conn = wrapper.connection
    if isinstance(conn, LeaseConnection):
        return conn.lease
    if not isinstance(conn, psycopg.Connection):
        raise ConfigurationError(f"skiplock needs Django's psycopg 3 backend; DATABASES[{using!r}] runs on "
                                 f"{type(conn).__module__}.{type(conn).__name__} (pip install 'psycopg[binary]')")
    return conn


def dsn_of(using: str = "default") -> str:
    """The libpq DSN of ``DATABASES[using]`` (its NAME, USER, PASSWORD, HOST, PORT and libpq OPTIONS
    such as ``sslmode`` or ``passfile``). It holds the password if the settings do: skiplock never
    logs it or shows it (``App.__repr__`` and errors redact it)."""
    params = dict(_wrapper(using).get_connection_params())
    for key in _NOT_LIBPQ:
        params.pop(key, None)
    try:
        return conninfo.make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"DATABASES[{using!r}] does not make a libpq DSN: {exc}") from None


class LeaseConnection:
    """What Django's connection wrapper holds while a handler runs: the lease connection, with cursors
    that are Django's (its cursor class and adapters: JSONField, inet and timestamptz values load as
    Django expects) and no way to end the lease's transaction from Django."""

    def __init__(self, lease: "psycopg.Connection[Any]", params: dict[str, Any]):
        self.lease = lease
        self._cursor_factory = params.get("cursor_factory") or psycopg.ClientCursor
        self._template: AdaptersMap | None = params.get("context")

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a named (server-side) cursor: psycopg's, on the lease connection
            return self.lease.cursor(*args, **kwargs)
        cur = self._cursor_factory(self.lease)
        template = self._template
        if template is not None:
            for name in _DJANGO_LOADED_TYPES:
                info = postgres.types.get(name)
                if info is None:
                    continue
                for fmt in (Format.TEXT, Format.BINARY):
                    loader = template.get_loader(info.oid, fmt)
                    if loader is not None:
                        cur.adapters.register_loader(info.oid, loader)
        return cur

    @property
    def adapters(self) -> AdaptersMap:
        # create_cursor compares the timestamptz loader's timezone with Django's: the template's is
        return self._template if self._template is not None else self.lease.adapters

    def commit(self) -> None:
        raise _ends_lease("commit")

    def rollback(self) -> None:
        raise _ends_lease("rollback")

    def close(self) -> None:
        raise _ends_lease("close")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lease, name)


def _ends_lease(what: str) -> Exception:
    from django.db import TransactionManagementError

    return TransactionManagementError(
        f"a skiplock handler cannot {what} the job's transaction: it commits with the job's completion")


class _HandlerBlock:
    """The atomic block Django is told it is in while a handler runs (not Django's own: it never
    exits, so nothing in the handler can commit). ``atomic(durable=True)`` sees it and refuses."""

    _from_testcase = False
    durable = False


_STATE = ("connection", "autocommit", "in_atomic_block", "commit_on_exit", "needs_rollback", "savepoint_ids",
          "atomic_blocks", "run_on_commit", "closed_in_transaction", "savepoint_state", "rollback_exc",
          "errors_occurred", "health_check_done")


@contextmanager
def bound_to_lease(lease: "psycopg.Connection[Any]", using: str = "default") -> Iterator[None]:
    """For the duration of the block, this thread's Django connection ``using`` runs on ``lease`` (the
    job's transaction). Its own connection (if any) is kept aside, untouched, and restored after."""
    wrapper = _wrapper(using)
    if wrapper.in_atomic_block:
        raise ConfigurationError("a skiplock job ran inside a Django atomic block of its own thread "
                                 f"(DATABASES[{using!r}]); run workers outside transaction.atomic()")
    saved = {name: getattr(wrapper, name) for name in _STATE}
    wrapper.connection = LeaseConnection(lease, wrapper.get_connection_params())
    wrapper.autocommit = False
    wrapper.in_atomic_block = True
    wrapper.commit_on_exit = False
    wrapper.needs_rollback = False
    wrapper.savepoint_ids = []
    wrapper.atomic_blocks = [_HandlerBlock()]
    wrapper.run_on_commit = []
    wrapper.closed_in_transaction = False
    wrapper.savepoint_state = 0
    wrapper.rollback_exc = None
    wrapper.errors_occurred = False
    wrapper.health_check_done = True  # the lease's connection is skiplock's to check
    try:
        yield
    finally:
        if wrapper.run_on_commit:
            log.warning("%d transaction.on_commit() callback(s) registered in a skiplock handler were dropped: the "
                        "job's commit is skiplock's (enqueue a job instead: it commits with this one)",
                        len(wrapper.run_on_commit))
        for name, value in saved.items():
            setattr(wrapper, name, value)
