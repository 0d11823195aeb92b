-- Named statements of the trace-context store (backend/postgres/tracing.py), used only when tracing
-- is on (skiplock.observability.tracing). Table: job_traces (migration 0011).

-- name: store_trace_context
-- One carrier for every job of an enqueue call (they were enqueued under one span). In the caller's
-- transaction when enqueue was given conn=..., else right after the enqueue's own commit. A job id
-- already stored (an enqueue that returned an existing unique job's id) keeps its first carrier.
INSERT INTO {schema}.job_traces (job_id, carrier)
SELECT id, %(carrier)s::jsonb FROM unnest(%(ids)s::bigint[]) AS id
ON CONFLICT (job_id) DO NOTHING;

-- name: take_trace_contexts
-- The carriers of the jobs a claim locked, read (not consumed) by each attempt, so a retry -- after
-- an attempt whose outcome committed -- continues the enqueue's trace too. Only a plain read: no
-- lock, so no other session ever waits on it. `forget_trace_context` deletes a job's carrier when
-- its final outcome is decided.
SELECT job_id, carrier::text FROM {schema}.job_traces WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: forget_trace_context
-- A job's carrier, once its attempt ended done, failed or cancelled (no attempt follows): deleted on
-- a pooled connection of its own, autocommit. A job that ends otherwise (never claimed and then
-- cancelled or deleted, or failed by the rescuer after its last claimed lease expired) leaves its
-- row behind: a few bytes per such job, only while tracing is on.
DELETE FROM {schema}.job_traces WHERE job_id = %(id)s;
