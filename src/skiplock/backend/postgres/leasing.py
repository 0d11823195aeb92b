"""The lease verbs on PostgreSQL: the claim, attempts and batches, savepoints and timeouts, the
finishing writes (``finish``), and the claimed lease's start, heartbeat and rescue. Each verb given a
backend session (lease.py) runs on its connection and raises only skiplock errors (``_on_session``)."""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any, Sequence

import psycopg
from psycopg.rows import tuple_row

from ..base import ClaimedJob, Finish, FlowKey, Lease, TaskLimits
from ..finishing import dispatch
from .connecting import row_of
from .connections import PostgresConnections
from .errors import translate
from .lease import PostgresLease, PostgresSession, local_timeouts
from .opening import send_opening
from .queries import claim_of_queues, complete_statement, int_array, json_array, prepare_now, text_array, with_limit

def _on_session(verb: Any) -> Any:
    """A verb whose first argument may be a backend session (lease.py): it runs on that session's
    connection, and raises only skiplock errors (``errors.translate``). Given a psycopg connection
    (the caller's own), the verb runs on it as it is."""

    @functools.wraps(verb)
    def on_session(self: "Leasing", conn: Any, *args: Any, **kwargs: Any) -> Any:
        if conn.__class__ is PostgresLease or conn.__class__ is PostgresSession:
            try:
                return verb(self, conn.conn, *args, **kwargs)
            except psycopg.Error as exc:
                raise translate(exc, self.dsn) from None
        return verb(self, conn, *args, **kwargs)

    return on_session


class Leasing(PostgresConnections):
    # ---- the lease ---------------------------------------------------------------------------

    @_on_session
    def claim(self, conn: psycopg.Connection[Any], queues: Sequence[str] | None, limit: int = 1,
              savepoint: bool = False, tasks: Sequence[str] | None = None) -> list[ClaimedJob]:
        """Lock up to ``limit`` available jobs in this connection's transaction (the lease): of
        ``queues`` (None: every queue), and of the task names ``tasks`` only (None: every task --
        what a worker with ``fail_unknown_tasks`` claims). With ``savepoint``, the first job's
        SAVEPOINT is sent in the claim's round trip (pipeline mode; before PostgreSQL 18 on its own
        after it, so that the lease's idle timeout stays armed: opening.py). The transaction's BEGIN
        is a round trip of its own either way: psycopg waits for it, in a pipeline too."""
        prefix = "claim" if tasks is None else "claim_tasks"
        if queues:  # one queue's walk, a few queues' walks merged, or jobs_claim_any_idx
            query, params = claim_of_queues(self.q, prefix, queues)
            params["limit"] = limit
        else:
            query, params = self.q[f"{prefix}_any_queue"], {"limit": limit}
        if tasks is not None:
            params["tasks"] = text_array(tuple(tasks))
        query = with_limit(query, limit)  # a plan the server keeps (queries.with_limit)
        prepare = prepare_now(conn)
        if not savepoint:
            return [ClaimedJob(*row) for row in conn.execute(query, params, prepare=prepare).fetchall()]
        cur = conn.cursor(row_factory=tuple_row)
        send_opening(conn, [(cur, query, params, prepare), (None, self.q["savepoint"], None, None)])
        return [ClaimedJob(*row) for row in cur.fetchall()]

    @_on_session
    def claimable_queues(self, conn: psycopg.Connection[Any], most: int) -> tuple[list[str], list[str]]:
        """(paused queues, queues with queued jobs -- only while some queue is paused; at most
        ``most`` + 1), in the lease's transaction (``claimable_queues`` in queries.sql)."""
        paused, queued = row_of(conn.execute(self.q["claimable_queues"], {"most": most}))
        return list(paused), list(queued)

    @_on_session
    def start_attempt(self, conn: psycopg.Connection[Any], job: ClaimedJob, worker: str,
                      lease_pid: int | None, exclusive: bool = True,
                      batch: int | None = None) -> tuple[int, str | None, str | None, bool]:
        """Count the attempt durably, outside the job's transaction (``conn`` from connect_bookkeeping).
        ``exclusive``: no other handler can run in this process meanwhile (a one-slot worker), so this
        attempt is charged if it never finishes; a worker with several slots passes False. ``batch``:
        the live batch whose transaction the job runs in (its row keeps the job; the rows of dead
        batches no longer list it).
        Returns (attempt number, cancellation reason if one was requested, the previous attempt's error
        if that attempt finished but its outcome is still unrecorded -- see ``record_outcome`` --, and
        whether the job is a suspect: its previous attempt never finished, so this one must run
        exclusively in its process, see ``mark_exclusive``)."""
        row = row_of(conn.execute(self.q["start_attempt"], {"id": job.id, "attempts": job.attempts, "worker": worker,
                                                            "backend_pid": lease_pid, "exclusive": exclusive,
                                                            "batch": batch}))
        return int(row[0]), row[1], row[2], bool(row[3])

    @_on_session
    def mark_exclusive(self, conn: psycopg.Connection[Any], job_id: int, attempt: int) -> None:
        conn.execute(self.q["mark_exclusive"], {"id": job_id, "attempt": attempt})

    @_on_session
    def start_batch(self, conn: psycopg.Connection[Any], jobs: Sequence[ClaimedJob], worker: str,
                    lease_pid: int) -> tuple[int, set[int], dict[int, str]]:
        """Mark a batch durably, outside its transaction (``conn`` from connect_bookkeeping), before its
        first handler starts. Returns (batch id, suspects: jobs to run alone with a counted attempt,
        {job id: cancellation reason})."""
        batch, suspects, cancelled, reasons = row_of(conn.execute(self.q["start_batch"], {
            "ids": int_array([j.id for j in jobs]), "attempts": int_array([j.attempts for j in jobs]),
            "worker": worker, "backend_pid": lease_pid}))
        return batch, set(suspects), dict(zip(cancelled, reasons))

    @_on_session
    def forget_dead_batches(self, conn: psycopg.Connection[Any], job_id: int, batch: int) -> None:
        conn.execute(self.q["forget_dead_batches"], {"id": job_id, "batch": batch})

    @_on_session
    def complete_batch(self, conn: psycopg.Connection[Any], batch: int, done: Sequence[tuple[ClaimedJob, int, str | None]],
                       started_at: datetime, worker: str) -> set[int]:
        """End the batch's transaction: write ``done`` ((job, attempt, result JSON)), delete the
        batch's row and COMMIT, in one round trip (pipeline mode). Returns the ids written; a job
        missing was refused (a cancellation was requested) and is still queued, unlocked."""
        cur = conn.cursor(row_factory=tuple_row)
        with conn.pipeline():
            conn.execute(self.q["generic_plans"])  # the handlers have run (see queries.sql)
            cur.execute(self.q["complete_batch"], {
                "ids": int_array([d[0].id for d in done]), "attempts": int_array([d[1] for d in done]),
                "results": json_array([d[2] for d in done]),
                "started_at": started_at, "worker": worker, "batch": batch, "prefix": f"{self.schema}:"},
                prepare=prepare_now(conn))
            conn.commit()
        return set(row_of(cur)[0])

    @_on_session
    def savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["savepoint"])

    @_on_session
    def rollback_to_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["rollback_to_savepoint"])

    @_on_session
    def release_savepoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self.q["release_savepoint"])

    @_on_session
    def set_local_timeouts(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        """A task's ``timeout`` for this transaction, counted from now (statement, idle and, on
        PostgreSQL 17+, transaction timeouts). Without server bounds, nothing: the watchdog bounds it."""
        if not self.capabilities.server_bounds_lease:
            return
        value, session = local_timeouts(seconds)
        conn.execute(self.q["set_local_timeouts"], {"value": value, "session": session})
        if conn.info.server_version >= 170000:
            conn.execute(self.q["stop_local_transaction_timeout"])  # so the next one re-arms the timer
            conn.execute(self.q["set_local_transaction_timeout"], {"value": session})

    @_on_session
    def complete(self, conn: psycopg.Connection[Any] | None, job: ClaimedJob, attempt: int, result_json: str | None,
                 started_at: datetime, worker: str, owner: uuid.UUID | None = None) -> bool:
        """False if the job was not written done (a cancellation was requested, or -- claimed lease --
        the lease is no longer ``owner``'s). ``conn`` None (claimed lease only: the fence is the lease,
        not a lock): a pooled connection, committed at once."""
        row = self._one(complete_statement(owner), {
            "id": job.id, "attempt": attempt, "result": result_json, "started_at": started_at, "worker": worker,
            "owner": owner, "notice": self.notice(job.id)}, conn)
        return bool(row[0])

    @_on_session
    def record_outcome(self, conn: psycopg.Connection[Any] | None, job: ClaimedJob, attempt: int, *, state: str,
                       delay: float | None, error: str | None, started_at: datetime, worker: str,
                       uncount: bool = False, owner: uuid.UUID | None = None) -> str | None:
        """Write a retry/failed/cancelled outcome; returns the state written, None if skipped (or,
        claimed lease, fenced off because the lease is no longer ``owner``'s). Transaction lease
        (``conn`` None): a row still locked by another session is skipped without waiting, and the
        error is kept in job_attempts until the job's next finishing write records it."""
        row = self._one("record_outcome", {
            "id": job.id, "attempt": attempt, "state": state, "delay": delay, "error": error, "owner": owner,
            "started_at": started_at, "worker": worker, "uncount": uncount, "notice": self.notice(job.id)}, conn)
        return row[0] if row else None

    def finish(self, lease: Lease | None, what: Finish) -> dict[int, str]:
        """The worker's one finishing write (base.Finish): ``done`` by ``complete`` (guarded on a
        pending cancellation; fenced on owner for a claimed lease), any other state by
        ``record_outcome`` (after rolling back to the job's savepoint when the write says ``undo``),
        a batch's deferred ``done`` writes by ``complete_batch`` with the COMMIT. ``Via.FRESH`` (or no
        lease): from a pooled connection, committed at once. Raises only skiplock errors."""
        try:
            return dispatch(self, lease, what, conn_of=lambda lease: lease.conn)
        except psycopg.Error as exc:
            raise translate(exc, self.dsn) from None

    # ---- the claimed lease -------------------------------------------------------------------

    @_on_session
    def start_claimed(self, conn: psycopg.Connection[Any], job: ClaimedJob, owner: uuid.UUID, lease: float,
                      worker: str) -> tuple[int, str | None] | None:
        """Mark the job running with ``owner`` (the caller commits). The flow-control slots the claim
        locked (``job.slots``) are written to the same owner in the same transaction (``own_slots``):
        they outlive it, held like the lease, freed by the finishing write or the rescuer."""
        row = self._one("start_claimed", {"id": job.id, "owner": owner, "lease": lease, "worker": worker}, conn)
        if row and job.slots:
            conn.execute(self.q["own_slots"], {"owner": owner, "keys": [k for k, _ in job.slots],
                                               "ns": [n for _, n in job.slots]})
        return (int(row[0]), row[1]) if row else None

    def heartbeat(self, leases: Sequence[tuple[int, uuid.UUID, float]]) -> set[int]:
        """Extend these leases; returns the ids still owned."""
        rows = self._all("heartbeat", {"ids": [x[0] for x in leases], "owners": [x[1] for x in leases],
                                       "leases": [x[2] for x in leases]})
        return {r[0] for r in rows}

    def rescue_expired(self, batch: int = 1000) -> list[tuple[int, str]]:
        return [(r[0], r[1]) for r in self._all("rescue_expired", {"batch": batch, "prefix": f"{self.schema}:"})]

    def cancel_running(self, job_id: int) -> bool:
        return self._one("cancel_running", {"id": job_id, "notice": self.notice(job_id)}) is not None

    # ---- flow control (docs/flow-control.md; `claim_flow` in queries.sql) ----------------------

    @_on_session
    def claim_flow(self, conn: psycopg.Connection[Any], queues: Sequence[str] | None, tasks: Sequence[str],
                   limits: Sequence[TaskLimits], held_queues: Sequence[str] = (), held_tasks: Sequence[str] = (),
                   held: Sequence[str] = (), fair_queue: str | None = None,
                   after: str | None = None) -> tuple[ClaimedJob, list[FlowKey], str | None] | None:
        """In the lease transaction: lock the first available flow-controlled job and one free slot
        of each of its concurrency keys -- with ``fair_queue``, round-robin across that queue's
        partitions: the first partition after ``after`` (``claim_flow_fair``). Returns the job
        (``slots``: those taken), its keys and its partition, or None. The caller must roll back
        unless every key with a limit got a slot."""
        got = self._flow_rows(conn, "claim_flow" if fair_queue is None else "claim_flow_fair", 1, queues, tasks,
                              limits, held_queues, held_tasks, held, fair_queue, after)
        return got[0] if got else None

    @_on_session
    def claim_flow_many(self, conn: psycopg.Connection[Any], limit: int, queues: Sequence[str] | None,
                        tasks: Sequence[str], limits: Sequence[TaskLimits], held_queues: Sequence[str] = (),
                        held_tasks: Sequence[str] = (),
                        held: Sequence[str] = ()) -> list[tuple[ClaimedJob, list[FlowKey], str | None]]:
        """``claim_flow`` for up to ``limit`` jobs in one statement, in (priority, run_at, id) order, with one
        free slot of each of their keys, shared by the jobs of that key: the batch runs them one after
        another (see ``claim_flow`` in queries.sql). The caller runs
        only the jobs whose every limited key got a slot; the others stay locked, untouched, until the
        transaction ends."""
        return self._flow_rows(conn, "claim_flow", limit, queues, tasks, limits, held_queues, held_tasks, held,
                               None, None)

    @_on_session
    def claim_flow_fair_many(self, conn: psycopg.Connection[Any], limit: int, queue: str, after: str | None,
                             tasks: Sequence[str], limits: Sequence[TaskLimits], held_tasks: Sequence[str] = (),
                             held: Sequence[str] = ()) -> list[tuple[ClaimedJob, list[FlowKey], str | None]]:
        """The fair claim for a batch: the first available job of each of the next ``limit``
        partitions of ``queue`` after ``after`` (``claim_flow_fair_many`` in queries.sql), in walk
        order (the partitions' collation), slots as in ``claim_flow_many``."""
        return self._flow_rows(conn, "claim_flow_fair_many", limit, None, tasks, limits, (), held_tasks, held,
                               queue, after)

    def _flow_rows(self, conn: psycopg.Connection[Any], name: str, limit: int, queues: Sequence[str] | None,
                   tasks: Sequence[str], limits: Sequence[TaskLimits], held_queues: Sequence[str],
                   held_tasks: Sequence[str], held: Sequence[str], fair_queue: str | None,
                   after: str | None) -> list[tuple[ClaimedJob, list[FlowKey], str | None]]:
        """The flow claim ``name``: its jobs locked, each with its keys and the slots the same
        statement took -- one free slot of each limited key of them all (``flow_slots_taken`` in
        queries.sql). One statement: the slots were a second one (``take_slots``), a round trip more
        per claim (docs/flow-control.md, "What it costs")."""
        params = {
            "queue": fair_queue, "after": after, "limit": limit,
            "queues": None if queues is None else list(queues), "tasks": list(tasks),
            "lt_tasks": [t.task for t in limits], "lt_concurrency": [t.concurrency for t in limits],
            "lt_partition_by": [t.partition_by for t in limits], "lt_every": [t.every for t in limits],
            "held_queues": list(held_queues), "held_tasks": list(held_tasks), "held": list(held)}
        if name == "claim_flow" and queues is not None and len(queues) == 1:
            name, params["queue"] = "claim_flow_of_queue", queues[0]
        if name != "claim_flow" or queues is None:
            # A fair queue's claim, the claim of one queue (jobs_claim_idx from the queue's first
            # entry) or over every queue (jobs_claim_any_idx): the same index walk whatever the
            # values, so it runs under its generic plan, kept (`generic_plan_for_claim`). The
            # limit of claim_flow and claim_flow_of_queue is a literal (queries.with_limit).
            text = with_limit(self.q[name], limit) if name in ("claim_flow", "claim_flow_of_queue") else self.q[name]
            cur = conn.cursor(row_factory=tuple_row)
            send_opening(conn, [(None, self.q["generic_plan_for_claim"], None, None),
                                (cur, text, params, prepare_now(conn)),
                                (None, self.q["plan_cache_mode_back"], None, None)])
            rows = cur.fetchall()
        else:
            rows = conn.execute(self.q[name], params).fetchall()
        if name == "claim_flow_fair_many":  # walk order (its `step`: the partitions' collation)
            rows = sorted(rows, key=lambda r: r[17])
        else:  # claim order: (priority, run_at, id)
            rows = sorted(rows, key=lambda r: (r[4], r[7], r[0]))
        out = []
        for row in rows:
            # its limited keys in key order: ["queue", ...] sorts before ["task", ...]; each row ends
            # with (task key's slot, slots existing, queue key's slot, slots existing)
            # (a key without a concurrency limit gets NULL for both: flow_slots_taken)
            flow_keys = [FlowKey(*k) for k in ((row[13], row[14], row[-2], row[-1], row[15]),
                                               (row[10], row[11], row[-4], row[-3], row[12]))
                         if k[1] is not None or k[4] is not None]
            job = ClaimedJob(*row[:10])
            job.slots = tuple((k.key, k.slot) for k in flow_keys if k.slot is not None)
            out.append((job, flow_keys, row[16]))
        return out

    def release_stale_slots(self) -> int:
        """Free the slots of owners no running job has (the rescuer's pass; see queries.sql)."""
        return int(self._one("release_stale_slots")[0])

    @_on_session
    def ensure_slots(self, conn: psycopg.Connection[Any], keys: Sequence[tuple[str, int]]) -> None:
        """Create the slots (key, 1..limit) that do not exist yet (autocommit: the bookkeeping session)."""
        conn.execute(self.q["ensure_slots"], {"keys": [k for k, _ in keys], "lims": [n for _, n in keys]})

    @_on_session
    def take_starts(self, conn: psycopg.Connection[Any], keys: Sequence[tuple[str, float]]) -> tuple[bool, dict[str, float]]:
        """One start of each rate-limited key, all or none (autocommit: the bookkeeping session).
        Returns (granted, {refusing key: seconds until it allows a start})."""
        params = {"keys": [k for k, _ in keys], "every": [e for _, e in keys]}
        for _ in range(2):
            granted, present, refused, waits, _moved = row_of(conn.execute(self.q["take_starts"], params))
            if present:
                return bool(granted), dict(zip(refused, waits))
            conn.execute(self.q["ensure_rates"], {"keys": params["keys"]})
        raise RuntimeError("flow_rates rows missing after ensure_rates")
