"""The port itself: the backend under test offers every verb the Backend protocol declares
(backend/base.py), with the same parameters -- what tests/unit/test_backend_seam.py checked for
PostgresBackend only, now for every backend the suite runs."""

from __future__ import annotations

import inspect

from skiplock.backend.base import Backend

DECLARED = sorted(name for name, member in vars(Backend).items() if callable(member) and not name.startswith("_"))


def test_the_backend_offers_every_verb_of_the_port_with_the_same_parameters(backend):
    """Guarantee (base.py): "The worker and the App only call these methods", so every backend has them all."""
    assert DECLARED, "the protocol declares verbs"
    for name in DECLARED:
        impl = getattr(type(backend), name, None)
        assert impl is not None, f"{type(backend).__name__} lacks {name}"
        want = list(inspect.signature(getattr(Backend, name)).parameters)
        have = list(inspect.signature(impl).parameters)
        assert have == want, f"{name}: {have} != {want}"
    for name in ("schema", "wake_payload"):
        assert isinstance(getattr(backend, name), str), name
