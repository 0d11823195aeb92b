-- skiplock schema, version 15: flow control changed at runtime (docs/flow-control.md) -- a fair
-- queue's per-partition weights, and task limits set in the database over the code's.

-- A fair queue's weights: a JSON object of partition -> weight, each a whole number >= 1 (checked by the caller;
-- a partition not named has weight 1). A partition of weight w gets w claims in a row of each
-- worker process's round (worker/flow.py), so w times the claims of a partition of weight 1 while
-- both have ready jobs. Read with the queue's limits by every worker (at most every second).
ALTER TABLE {schema}.queue_limits ADD COLUMN weights jsonb NOT NULL DEFAULT '{{}}'::jsonb
    CHECK (jsonb_typeof(weights) = 'object');

-- A task's limits set at runtime (`skiplock limit --task NAME`): while a row exists, its concurrency
-- and rate replace the ones in the task's code (`@app.task(concurrency=, rate=)`) in every worker
-- that has the task, at its next refresh (at most every second), no restart. NULL: no such limit
-- (the code's is overridden too). The code's partition_by still applies. No row: the code's limits.
CREATE TABLE {schema}.task_limits (
    task        text        PRIMARY KEY,
    concurrency integer     CHECK (concurrency >= 1),
    rate_count  integer     CHECK (rate_count >= 1),
    rate_period float8      CHECK (rate_period > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_period IS NULL))
);
