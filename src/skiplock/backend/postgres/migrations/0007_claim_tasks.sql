-- skiplock schema, version 7: a worker claims only the tasks it has handlers for.
--
-- The claim filters `task = ANY(<the worker's task names>)`. The claim indexes get `task` as a last
-- key column, so that filter is checked on index entries (an Index Cond) while the scan still walks
-- them in the claim's order: queued jobs of other tasks ahead of a worker's own cost it index entries
-- only (hundreds per page), never a heap fetch and a row each. When every queued job is the worker's
-- own -- the normal case -- the first entry matches, as before. (Rebuilding an index locks the jobs
-- table against writes while it builds; a large backlog makes this migration take that long.)
DROP INDEX {schema}.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority, id, task) WHERE state = 'queued';
DROP INDEX {schema}.jobs_claim_any_idx;
CREATE INDEX jobs_claim_any_idx ON {schema}.jobs (priority, id, task) WHERE state = 'queued';

-- The workers running now, as each says itself: its task names and queues (NULL: every queue). A
-- worker inserts its row when it starts, refreshes last_seen every few seconds and deletes the row
-- when it exits; a row not refreshed for a while is a worker that died without saying so (it is
-- ignored, and deleted after an hour by the next worker that refreshes its own). `skiplock status`
-- and `skiplock jobs` compare queued jobs against the live rows: a job whose task no live worker
-- serving its queue has registered waits for a worker that knows it, untouched.
CREATE TABLE {schema}.workers (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL,
    tasks      text[]      NOT NULL,
    queues     text[],
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now()
);
