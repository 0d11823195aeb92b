"""The run gate of one worker process: slots hold it ``shared``; a suspect's run holds it alone.

A job whose previous attempt never finished (its session died: a killed process, a lost connection)
is a suspect: it may be the one that kills its worker. Its next attempt runs alone in its process --
no other job of the process runs meanwhile, and none starts until it is done -- so if the process
dies then, the crash is its own and its attempt is charged (see ``start_attempt`` in queries.sql).
Runs of other jobs never share a crash with it.

The rule that keeps the gate out of every deadlock: **nobody waits at the gate while holding a
transaction.** A slot takes the gate (``shared``) before its claim and gives it back after its
COMMIT, so a slot that waits for it holds no lock. A slot that finds a suspect in its claim holds
row locks -- its jobs', and possibly a row it re-checked and skipped: PostgreSQL keeps such locks to
the end of the transaction -- and another slot's finishing write may be waiting for one of them.
So it never waits there: it runs the suspect at once if it is the only slot holding the gate
(``alone``); otherwise it lets its transaction go (the job is queued again, untouched; its attempt
is not charged, see ``start_attempt``) and waits for the gate with ``exclusive``, holding nothing,
then claims again. (Seen before this rule: a 2-slot worker after a server restart, a claimed job's
``complete`` waiting on the claim of a slot that waited, holding the gate shared, for the other
slot to finish: neither ever moved.)

``RunGate`` is the sync worker's (threads); ``AsyncRunGate`` the asyncio worker's (tasks on one loop):
there a task holds the gate only while its handler runs, around no write of its own.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator


class RunAlone(Exception):
    """A suspect could not run alone at once: the slot has let its transaction go (nothing of it was
    written) and holds the gate ``exclusive`` for its next claim (see the module's rule)."""

    def __init__(self, job_id: int):
        super().__init__(f"job {job_id} must run alone in its process")
        self.job_id = job_id


class RunGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0  # shared holds
        self._owner: int | None = None  # the thread holding the gate alone
        self._waiting = 0  # threads waiting for an exclusive hold
        self._local = threading.local()  # this thread's shared holds

    def _held(self) -> int:
        return getattr(self._local, "held", 0)

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate shared (a slot, from its claim to its COMMIT): wait while a run holds it
        alone or waits to. Call it holding no transaction."""
        with self._cond:
            self._cond.wait_for(lambda: self._owner is None and not self._waiting)
            self._shared += 1
        self._local.held = self._held() + 1
        try:
            yield
        finally:
            self._local.held -= 1
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    def wait_open(self, stopping: threading.Event) -> None:
        """Wait (holding nothing) while a run holds the gate alone or waits to, or until ``stopping``:
        a stopping slot does not wait for ``shared``."""
        with self._cond:
            while (self._owner is not None or self._waiting) and not stopping.is_set():
                self._cond.wait(0.1)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until nobody else holds the gate, then hold it alone: nobody takes it until this
        hold ends. Call it holding no transaction, and not under a shared hold of this thread."""
        if self._held():
            raise RuntimeError("RunGate.exclusive under a shared hold of the same thread would wait for itself")
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._owner is None and self._shared == 0)
            finally:
                self._waiting -= 1
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()

    @contextmanager
    def alone(self) -> Iterator[bool]:
        """Hold the gate alone for the block if that needs no wait -- this thread holds it alone
        already, or nobody else holds it (this thread's own shared hold aside) -- and yield True;
        otherwise yield False at once (the caller lets its transaction go: ``RunAlone``)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                state = "held"
            elif self._owner is None and self._shared == self._held():
                self._owner, state = me, "taken"
            else:
                state = "busy"
        if state == "busy":
            yield False
            return
        try:
            yield True
        finally:
            if state == "taken":
                with self._cond:
                    self._owner = None
                    self._cond.notify_all()


class AsyncRunGate:
    """The process's run gate on its event loop (``RunGate``'s rule, for tasks): handlers run
    ``shared``; a suspect's handler runs ``exclusive`` -- it waits until no other handler of the process
    runs, and none starts until it is done (a waiting exclusive run goes before new shared ones) -- so
    if the process dies then, the crash is its own and its attempt is charged."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()
