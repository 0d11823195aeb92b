-- skiplock schema, version 1. {schema} is replaced by the quoted schema identifier.

CREATE TABLE {schema}.jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL DEFAULT 'default',
    task          text        NOT NULL,
    args          jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    priority      integer     NOT NULL DEFAULT 0,
    state         text        NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    run_at        timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz,
    last_error    text,
    errors        jsonb       NOT NULL DEFAULT '[]'::jsonb,
    result        jsonb,
    worker        text,
    CHECK (state IN ('done', 'failed', 'cancelled') = (finished_at IS NOT NULL)),
    -- every client can read these back (no BC dates, no year 10000): one unreadable row would
    -- otherwise break the claim for every worker
    CHECK (run_at > '1900-01-01 00:00:00+00' AND run_at < '9000-01-01 00:00:00+00')
);

-- The claim reads only queued rows, in the claim's order: finished rows never enter this index,
-- so the hot path does not slow down as done jobs accumulate.
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority, id) WHERE state = 'queued';
-- The same for workers that serve every queue.
CREATE INDEX jobs_claim_any_idx ON {schema}.jobs (priority, id) WHERE state = 'queued';
CREATE INDEX jobs_state_queue_idx ON {schema}.jobs (state, queue);

-- Attempts started, written outside the job's own transaction (autocommit, no wait on the job's
-- row lock). A worker that dies mid-handler rolls back everything it did to the jobs row, but not
-- this count, so a job that kills its worker still ends 'failed' after max_attempts.
CREATE TABLE {schema}.job_attempts (
    job_id     bigint      PRIMARY KEY,
    started    integer     NOT NULL,
    worker     text,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- A queue table churns: every job is inserted, updated once or twice and later deleted. Vacuum it
-- by churn (every 2,000 dead rows), not by size: a scale factor would let a large backlog of queued
-- rows postpone vacuum for ever while the claim index fills with dead entries. Leave room for HOT.
ALTER TABLE {schema}.jobs SET (fillfactor = 90,
                               autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
                               autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
                               autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE {schema}.job_attempts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
