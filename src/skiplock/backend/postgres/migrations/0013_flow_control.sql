-- skiplock schema, version 13: flow control (docs/flow-control.md) -- concurrency limits held as
-- slot rows, rate limits as one timestamp per key, per-queue limits changed at runtime.

-- An explicit partition given at enqueue (`partition="customer:42"`); a task with `partition_by`
-- and no explicit partition is partitioned by that argument's value (computed by the claim).
-- Nullable with no default: adding it rewrites nothing.
ALTER TABLE {schema}.jobs ADD COLUMN partition text;

-- Per-queue limits, set and changed at runtime (`skiplock limit QUEUE ...`): every claim of a
-- flow-controlled job reads this table, so running workers honour a change at their next claim.
-- concurrency: at most this many jobs of the queue run at once across every worker; rate: at most
-- rate_count starts per rate_period seconds (a smooth schedule: see `take_starts`). NULL: no limit.
-- fair: claims go round-robin across the queue's partitions (`claim_flow_fair`).
CREATE TABLE {schema}.queue_limits (
    queue       text        PRIMARY KEY,
    concurrency integer     CHECK (concurrency >= 1),
    rate_count  integer     CHECK (rate_count >= 1),
    rate_period float8      CHECK (rate_period > 0),
    fair        boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_period IS NULL))
);

-- The concurrency slots of one limited key (a task's, a task partition's, a queue's): rows
-- (key, 1..limit). A running flow-controlled job holds one slot of each of its keys:
-- * transaction lease: the slot row is locked FOR UPDATE (SKIP LOCKED) by the job's lease
--   transaction and never written, so the COMMIT or rollback that ends the job releases it -- a
--   killed worker's slots come back the moment the server ends its session;
-- * claimed lease: the claim transaction writes the job's owner token into the slot (`owner`) and
--   commits; the slot is taken while a job with that owner is 'running' (the fence of the lease), so
--   the finishing write that clears the job's owner, or the rescuer returning it, frees the slot.
-- Only slots numbered up to the key's current limit are taken, so lowering a limit takes effect at
-- once for new claims (jobs already running on higher slots finish).
CREATE TABLE {schema}.flow_slots (
    key   text    NOT NULL,
    n     integer NOT NULL CHECK (n >= 1),
    owner uuid,
    PRIMARY KEY (key, n)
);

-- Rate limits: one row per limited key, its theoretical arrival time (GCRA, the virtual-scheduling
-- form of a token bucket): a start is allowed when `tat <= now()`, and moves `tat` to
-- greatest(tat, now()) + period/count. Written only by short autocommit statements.
CREATE TABLE {schema}.flow_rates (
    key text        PRIMARY KEY,
    tat timestamptz NOT NULL
);

-- Fair queues: the queued jobs of each partition in (priority, id) order, partitions in order, so
-- the fair claim steps from one partition to the next in one index descent (`claim_flow_fair`).
CREATE INDEX jobs_fair_idx ON {schema}.jobs (queue, partition, priority, id)
    WHERE state = 'queued' AND partition IS NOT NULL;

-- A claimed-lease job's owner, for the slot test above (only running jobs have one).
CREATE INDEX jobs_owner_idx ON {schema}.jobs (owner) WHERE owner IS NOT NULL;

-- The slots a claimed-lease job holds, freed by its finishing write or its rescue (by owner).
CREATE INDEX flow_slots_owner_idx ON {schema}.flow_slots (owner) WHERE owner IS NOT NULL;
