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
-- The carriers of the jobs a claim locked, consumed in the lease transaction: gone if it commits
-- (the attempt's outcome is written), back if it rolls back (the next attempt finds them again).
-- Only rows of jobs this transaction holds locked are touched, so no other lease can wait on it.
DELETE FROM {schema}.job_traces WHERE job_id = ANY(%(ids)s::bigint[])
RETURNING job_id, carrier::text;
