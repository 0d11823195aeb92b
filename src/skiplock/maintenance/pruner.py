"""The pruner service: deletes finished jobs past their retention (see App.prune)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .service import Service

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("skiplock.pruner")


class Pruner(Service):
    name = "pruner"

    def __init__(self, app: "App", interval: float = 60.0):
        super().__init__(interval)
        self.app = app

    def step(self) -> None:
        deleted = self.app.prune()
        if any(deleted.values()):
            log.info("pruned finished jobs: %s", ", ".join(f"{n} {s}" for s, n in deleted.items() if n))
