"""The worker's one finishing write (``Backend.finish``), dispatched the same way on every backend.

``base.Finish`` says what to write and how (``Via``); each backend supplies the verbs it writes with
(``complete``, ``record_outcome``, ``complete_batch``, ``rollback_to_savepoint``) and ``conn_of``,
what those verbs take for a lease (PostgreSQL: the lease's driver connection; MySQL: the lease
itself). The dispatch:

- ``Via.BATCH_COMMIT``: a batch's deferred ``done`` writes by ``complete_batch``, with its COMMIT;
- ``done``: ``complete`` (guarded on a pending cancellation; fenced on the owner for a claimed lease),
  after releasing the job's savepoint when the write says ``release``;
- any other state: ``record_outcome``, after rolling back to the job's savepoint and releasing it
  when the write says ``undo``;
- ``Via.FRESH`` (or no lease): ``conn`` None, i.e. the backend's own fresh transaction.

So a job's row is always written by the lease's top transaction, never inside the handler's
savepoint (``savepoint`` in queries.sql: a row locked by the transaction and updated by a
subtransaction gets a MultiXact that every later claim stepping over it must look up). The release
is a round trip of its own: sent in one psycopg pipeline with the write, 64 slots of writing jobs
drained at 0.6-0.9 of the speed of the two statements (docs/benchmarks.md, "Session 29").

Returns {job id: state written}; a job missing was refused by its guard or skipped (see base.py).
Driver-free: each backend translates its driver's errors around the call.
"""

from __future__ import annotations

from typing import Any, Callable

from .base import Finish, Lease, Via


def dispatch(backend: Any, lease: Lease | None, what: Finish,
             conn_of: Callable[[Lease], Any] = lambda lease: lease) -> dict[int, str]:
    if what.via is Via.BATCH_COMMIT:
        assert lease is not None and what.batch is not None
        writes = what.writes
        first = writes[0] if writes else None
        ids = backend.complete_batch(conn_of(lease), what.batch, [(w.job, w.attempt, w.result) for w in writes],
                                     first.started_at if first else None, first.worker if first else None)
        return {i: "done" for i in ids}
    (w,) = what.writes
    conn = None if lease is None or what.via is Via.FRESH else conn_of(lease)
    if w.state == "done":
        if w.release and conn is not None:
            backend.release_savepoint(conn)
        done = backend.complete(conn, w.job, w.attempt, w.result, w.started_at, w.worker, w.owner)
        return {w.job.id: "done"} if done else {}
    if w.undo and conn is not None:
        backend.rollback_to_savepoint(conn)
        backend.release_savepoint(conn)
    state = backend.record_outcome(conn, w.job, w.attempt, state=w.state, delay=w.delay, error=w.error,
                                   started_at=w.started_at, worker=w.worker, uncount=w.uncount, owner=w.owner)
    return {} if state is None else {w.job.id: state}
