"""The run gate of one worker process: handlers run ``shared``, a suspect's handler ``exclusive``.

A job whose previous attempt never finished (its session died: a killed process, a lost connection)
is a suspect: it may be the one that kills its worker. Its next handler runs exclusively in its
process -- it waits until no other handler of the process is running, and no other handler starts
until it is done (a waiting exclusive run goes before new shared ones) -- so if the process dies
then, the crash is its own and its attempt is charged (see ``start_attempt`` in queries.sql). Runs
of other jobs never share a crash with it.

``RunGate`` is the sync worker's (threads); ``AsyncRunGate`` the asyncio worker's (tasks on one loop),
with the same rule.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator


class RunGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0  # threads holding a shared hold
        self._exclusive = False
        self._waiting = 0  # threads waiting for an exclusive hold
        self._local = threading.local()

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        self._local.held = getattr(self._local, "held", 0) + 1
        try:
            yield
        finally:
            self._local.held -= 1
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    def wait_open(self, stopping: threading.Event) -> None:
        """Wait (without holding anything) while an exclusive run holds or waits for the gate, so
        that a slot does not claim jobs only to hold their locks until that run is done."""
        with self._cond:
            while (self._exclusive or self._waiting) and not stopping.is_set():
                self._cond.wait(0.1)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until no other thread holds the gate, then hold it alone. This thread's own shared
        holds are given up meanwhile and taken back after (without waiting)."""
        held = getattr(self._local, "held", 0)
        with self._cond:
            self._shared -= held
            self._waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._shared += held
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
