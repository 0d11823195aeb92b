"""The backend seam: PostgresBackend provides every operation the Backend protocol declares."""

import inspect

from skiplock.backend.base import Backend
from skiplock.backend.postgres import PostgresBackend


def test_postgres_backend_implements_every_seam_operation_with_the_same_parameters():
    declared = {name for name, member in vars(Backend).items() if callable(member) and not name.startswith("_")}
    assert declared, "the protocol declares operations"
    for name in sorted(declared):
        impl = getattr(PostgresBackend, name, None)
        assert impl is not None, f"PostgresBackend lacks {name}"
        want = list(inspect.signature(getattr(Backend, name)).parameters)
        have = list(inspect.signature(impl).parameters)
        assert have == want, f"{name}: {have} != {want}"
