"""A lease transaction's BEGIN in the same round trip as its first statements (the claim).

psycopg opens a transaction itself: before the first statement of one it sends BEGIN and waits for
the answer -- a round trip of its own, in a pipeline too (``_start_query`` syncs after it). Every
claim paid it: BEGIN, then the claim, two round trips before a job could start; on two busy cores
each is a context switch to the server and back, a millisecond or more (docs/benchmarks.md,
"Session 33").

``send_opening(conn, steps)`` sends a transaction's first statements, when there are several (the
claim and the job's savepoint; a flow claim and the settings around it), in one pipeline whose
first command is that BEGIN, queued like any statement. psycopg then finds the pipeline busy (the
connection's status is ACTIVE, not IDLE) and sends no BEGIN of its own; from the pipeline's sync on,
the connection is in the transaction exactly as if psycopg had opened it (nothing else of psycopg's
state records who sent BEGIN). The lease's guarantees are unchanged: the statements run in the
transaction BEGIN opened, or the pipeline raises (if BEGIN failed, nothing ran).

A statement alone (the plain claim) is sent as it is, psycopg sending BEGIN before it: a pipeline
for it cost more than the round trip it saved (measured on drains and at half the capacity;
docs/benchmarks.md, "Session 33").

To queue BEGIN without psycopg's own, the connection's autocommit flag is set for that one command:
through psycopg's attribute ``_autocommit``, since its public setter refuses any change while a
command may be in flight. Where that attribute is missing (another psycopg), or the connection has
transaction settings psycopg would add to BEGIN (isolation level, read only, deferrable), nothing is
queued and psycopg opens the transaction as before: one round trip more, nothing else differs.

PostgreSQL before 18 (``flush_disarms_idle_timeout``): psycopg ends every pipeline with a Flush
message after its Sync, and there the Flush turns the idle-in-transaction timer off until the next
Sync -- a lease left idle after a pipelined claim was never ended by ``lease_timeout`` (measured on
15: still idle in transaction 3 s past a 1 s timeout; on 18 it is ended; 16 and 17 not measured,
taken as 15). There the last statement goes after the pipeline, on its own (its Sync arms the
timer): the savepoint, or the flow claim's setting put back, is a round trip after the pipeline
that carries BEGIN and the claim.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

import psycopg
from psycopg.pq import TransactionStatus

_IDLE = TransactionStatus.IDLE


def can_begin_early(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``begun`` queues BEGIN on ``conn``: outside a transaction, not autocommitting, with
    psycopg's plain BEGIN (no transaction settings) and its ``_autocommit`` attribute."""
    return (conn.info.transaction_status == _IDLE and isinstance(getattr(conn, "_autocommit", None), bool)
            and not conn._autocommit and conn.isolation_level is None and conn.read_only is None
            and conn.deferrable is None)


# A statement of ``send_opening``: (the cursor to run it on, None: the connection's own), the query,
# its parameters, psycopg's ``prepare``.
Step = Tuple[Any, str, Any, Any]


def flush_disarms_idle_timeout(conn: psycopg.Connection[Any]) -> bool:
    """Whether a pipeline's closing Flush leaves the idle-in-transaction timer off (before 18; see
    the module's docstring)."""
    return conn.info.server_version < 180000


def send_opening(conn: psycopg.Connection[Any], steps: Sequence[Step]) -> None:
    """Run ``steps`` (a lease transaction's first statements, or statements in an open one): several
    in one pipeline, the transaction's BEGIN first when one must be sent; one alone as it is (see the
    module's docstring)."""
    piped = list(steps)
    last = piped.pop() if flush_disarms_idle_timeout(conn) else None
    if len(steps) > 1:
        early = can_begin_early(conn)
        with conn.pipeline():
            if early:
                conn._autocommit = True
                try:
                    conn.execute("BEGIN", prepare=False)  # (psycopg would prepare it at its 6th run)
                finally:
                    conn._autocommit = False
            for step in piped:
                _run(conn, step)
    elif piped:
        _run(conn, piped[0])
    if last is not None:
        _run(conn, last)


def _run(conn: psycopg.Connection[Any], step: Step) -> None:
    cur, query, params, prepare = step
    (conn if cur is None else cur).execute(query, params, prepare=prepare)
