-- skiplock schema, version 2: unique jobs, cancellation, paused queues, periodic ticks, waiters,
-- retention.

-- At most one queued or running job per unique key, enforced by the database (race-free).
ALTER TABLE {schema}.jobs ADD COLUMN unique_key text;
CREATE UNIQUE INDEX jobs_unique_key_idx ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

-- The backend holding a transaction lease, so a cancellation can end that session.
ALTER TABLE {schema}.job_attempts ADD COLUMN backend_pid integer;

-- Cancellation requests, written without waiting on the job's row lock. A worker that claims the job
-- (or records its failure) sees the request and ends the job 'cancelled'; the 'done' write is
-- guarded by the absence of a request, so a finishing write never overwrites a cancellation.
CREATE TABLE {schema}.job_cancellations (
    job_id       bigint      PRIMARY KEY,
    reason       text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);

-- Paused queues: running workers stop claiming from them at once (the claim checks this table).
CREATE TABLE {schema}.paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- One row per (schedule, tick): whichever scheduler inserts it enqueues that tick's job, so any
-- number of worker processes enqueue each tick exactly once.
CREATE TABLE {schema}.periodic_ticks (
    schedule   text        NOT NULL,
    tick       timestamptz NOT NULL,
    job_id     bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick)
);

-- Jobs someone is waiting on (app.wait): only those finishing writes send a NOTIFY, so ordinary
-- jobs never take the notification queue's lock at commit.
CREATE TABLE {schema}.job_waiters (
    job_id bigint      PRIMARY KEY,
    since  timestamptz NOT NULL DEFAULT now()
);

-- Retention walks finished rows by age without touching the queued ones.
CREATE INDEX jobs_finished_idx ON {schema}.jobs (finished_at) WHERE state IN ('done', 'failed', 'cancelled');
