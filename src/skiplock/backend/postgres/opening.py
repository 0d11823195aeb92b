"""The statements that open a lease transaction (the claim, with the job's savepoint or a flow
claim's settings around it), sent in one pipeline -- and the idle timeout of the lease after them.

A lease left idle in its transaction must be ended by the server at ``lease_timeout``
(``idle_in_transaction_session_timeout``; docs/guarantees.md). psycopg ends every pipeline with a
Flush message after its Sync, and before PostgreSQL 18 that Flush turns the server's idle-in-
transaction timer off until the next Sync: a lease left idle after a pipelined claim was never
ended (measured on 15: still idle in transaction 3 s past a 1 s timeout; on 18 it is ended; 16 and
17 not measured, taken as 15). So there (``flush_disarms_idle_timeout``) the last statement goes on
its own after the pipeline: its Sync arms the timer. A round trip more on those servers, for the
claims that pipeline (with the job's savepoint; flow claims); none on 18.

Not kept: BEGIN queued first in the pipeline, so that psycopg's own BEGIN (a round trip of its
own: it syncs after it) is not sent -- one round trip fewer per claim, and no faster: drains 0.96 x,
pickup p99 at half the capacity 1.11 x and 0.96 x of before, a flow claim the same time alone
(docs/benchmarks.md, "Session 33").
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

import psycopg

# A statement of ``send_opening``: (the cursor to run it on, None: the connection's own), the query,
# its parameters, psycopg's ``prepare``.
Step = Tuple[Any, str, Any, Any]


def flush_disarms_idle_timeout(conn: psycopg.Connection[Any]) -> bool:
    """Whether a pipeline's closing Flush leaves the idle-in-transaction timer off (before 18; see
    the module's docstring)."""
    return conn.info.server_version < 180000


def send_opening(conn: psycopg.Connection[Any], steps: Sequence[Step]) -> None:
    """Run ``steps`` on the lease ``conn``: several in one pipeline (psycopg sends BEGIN before it
    when the transaction is not open yet), the last after it, on its own, where a pipeline's end
    would leave the lease's idle timeout off; one alone as it is."""
    piped = list(steps)
    last = piped.pop() if flush_disarms_idle_timeout(conn) else None
    if len(piped) > 1:
        with conn.pipeline():
            for step in piped:
                _run(conn, step)
    elif piped:
        _run(conn, piped[0])
    if last is not None:
        _run(conn, last)


def _run(conn: psycopg.Connection[Any], step: Step) -> None:
    cur, query, params, prepare = step
    (conn if cur is None else cur).execute(query, params, prepare=prepare)
