"""Each slot's attempt-counting session (``Backend.connect_bookkeeping``): autocommit, outside every
lease, so a count survives the job's rollback and the death of its process (see docs/guarantees.md,
"The claim"). One session per slot thread: slots share no lock for it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, TypeVar

from ..errors import ConnectionLost

if TYPE_CHECKING:
    from ..backend.base import Backend, Session

T = TypeVar("T")


class Bookkeeping:
    def __init__(self, backend: "Backend"):
        self.backend = backend
        self._sessions: list["Session"] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def run(self, op: "Callable[[Session], T]", *, again: bool = True) -> T:
        """Run ``op`` on this thread's session, reconnecting once if the session was lost (an error
        of a live session -- a deadlock, say -- is raised: the session is fine). ``again=False``:
        a lost session is not tried again, ConnectionLost is raised -- for the writes that mark a job
        whose lease is held meanwhile (``start_attempt``, ``start_batch``): a session lost with the
        server (a restart) took the lease with it, another worker may since have claimed and finished
        the job, and a write sent again then would leave its attempt (or batch) row behind a
        finished job. Raised, the slot ends its lease and starts over; the job runs again."""
        session: "Session | None" = getattr(self._local, "session", None)
        for retry in ((False, True) if again else (True,)):
            if session is None or not session.alive():
                session = self.backend.connect_bookkeeping()
                with self._lock:
                    self._sessions.append(session)
                self._local.session = session
            try:
                return op(session)
            except ConnectionLost:
                session.close()
                session = None
                if retry:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()
