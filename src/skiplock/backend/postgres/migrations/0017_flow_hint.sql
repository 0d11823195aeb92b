-- skiplock schema, version 17: the plain claims no longer walk the waiting jobs of limited queues
-- (docs/flow-control.md, "Which index each claim walks").
--
-- `flow`: the job's queue had limits (a queue_limits row with a concurrency, a rate or `fair`) when
-- the job was enqueued, or when the limits were set while it waited. jobs_claim_any_idx, the index
-- the plain claims over several queues or every queue walk in (priority, id) order, now holds only
-- the queued jobs without it, so a limited queue's backlog ahead of them costs those claims nothing
-- (before: one heap read per waiting job, 10-15 ms per claim behind 20,000 of them).
--
-- The flag is a hint in one direction only; the invariant that keeps every job claimable is:
--   (I1) a job that is not finished (queued, running, blocked) with `flow` has a queue_limits row.
-- * The claims' filters are unchanged (a job of a limited queue without the flag is still left to
--   the flow claim by the plain claims' test of queue_limits): a job never runs under the wrong
--   claim, whatever its flag.
-- * The flow claim of a limited queue walks jobs_claim_idx (every queued job of the queue, with or
--   without the flag), one queue at a time, so a job without the flag is never lost to it either.
-- * A flagged job's queue keeps its row (I1): an enqueue sets `flow` only for a row with limits that
--   it locks FOR KEY SHARE until it commits; a queue's row is deleted (`retire_queue_limit`) only
--   under FOR UPDATE, which waits for those enqueues, and only when a new snapshot finds no
--   unfinished flagged job of the queue; clearing a queue's limits first leaves the row without
--   limits ("retiring": the flow claim still serves the queue, with no slot or rate to take) until
--   then. A failed or cancelled job put back (`retry_job`, `retry_failed`) gets its flag anew, as an
--   enqueue sets it.
-- Adding a NOT NULL column with a constant default rewrites nothing; the jobs of limited queues
-- waiting now are flagged here, and the claim index is rebuilt (it locks the table against writes
-- while it builds, as migration 7 did).
ALTER TABLE {schema}.jobs ADD COLUMN flow boolean NOT NULL DEFAULT false;

-- Whether a queue's row has limits (false: a row left without any, retiring): the one definition
-- every statement tests (a stored generated column; the table holds a row per limited queue).
ALTER TABLE {schema}.queue_limits ADD COLUMN limited boolean
    GENERATED ALWAYS AS (concurrency IS NOT NULL OR rate_count IS NOT NULL OR fair) STORED;

UPDATE {schema}.jobs SET flow = true
 WHERE state IN ('queued', 'running', 'blocked')
   AND queue IN (SELECT queue FROM {schema}.queue_limits WHERE limited);

DROP INDEX {schema}.jobs_claim_any_idx;
CREATE INDEX jobs_claim_any_idx ON {schema}.jobs (priority, id, task) WHERE state = 'queued' AND NOT flow;

-- The unfinished flagged jobs of a queue, for the retirement of its row (I1): found without walking
-- the queue's other jobs. Only flagged jobs have entries.
CREATE INDEX jobs_flow_idx ON {schema}.jobs (queue) WHERE flow AND state IN ('queued', 'running', 'blocked');
