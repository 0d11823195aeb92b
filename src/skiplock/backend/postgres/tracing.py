"""The PostgreSQL trace-context store (``Backend.trace_store``): the carrier a job was enqueued under,
kept in ``job_traces`` (migration 0011, statements in tracing.sql). Used only when tracing is on."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

from .queries import load_queries

if TYPE_CHECKING:
    from ...backend.base import Lease
    from .backend import PostgresBackend


class PostgresTraceStore:
    def __init__(self, backend: "PostgresBackend"):
        self.backend = backend
        self.q = load_queries(backend.schema, "tracing.sql")

    def store(self, ids: Sequence[int], carrier: dict[str, str], conn: Any = None) -> None:
        """Keep ``carrier`` for ``ids``: on ``conn`` (the caller's transaction) or a pooled connection."""
        params = {"ids": list(ids), "carrier": json.dumps(carrier)}
        if conn is not None:
            conn.execute(self.q["store_trace_context"], params)
            return
        with self.backend._conn() as pooled:
            pooled.execute(self.q["store_trace_context"], params)

    async def store_async(self, ids: Sequence[int], carrier: dict[str, str], aconn: Any) -> None:
        """:meth:`store` in the caller's ``AsyncConnection`` transaction (AsyncApp's enqueue)."""
        await aconn.execute(self.q["store_trace_context"], {"ids": list(ids), "carrier": json.dumps(carrier)})

    def forget(self, job_id: int) -> None:
        """Delete ``job_id``'s carrier (its final outcome is decided), on a pooled connection."""
        with self.backend._conn() as pooled:
            pooled.execute(self.q["forget_trace_context"], {"id": job_id})

    def take(self, lease: "Lease", ids: Sequence[int]) -> dict[int, dict[str, str]]:
        """The carriers of the jobs ``lease`` claimed, read in its transaction (kept for a retry)."""
        rows = lease.conn.execute(self.q["take_trace_contexts"], {"ids": list(ids)}).fetchall()
        return {job_id: json.loads(text) for job_id, text in rows}
