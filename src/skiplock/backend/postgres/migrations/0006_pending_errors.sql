-- skiplock schema, version 6: an attempt's error is never lost because its row was still locked.
--
-- When a job's connection dies, its outcome is written from a fresh transaction that never waits on
-- the job's row lock (`record_outcome`). If the dead session has not exited yet (a backend slow to
-- die holds the lock past pg_terminate_backend's 5 s wait), or another worker already claimed the job
-- again, that write is skipped. The error is then appended here instead, in the same statement, on
-- the attempt counter's row -- outside every lease transaction, so no rollback can take it back --
-- and every finishing write (`complete`, `complete_batch`, `record_outcome`, `cancel_if_unlocked`)
-- folds these entries into jobs.errors / last_error and removes them in the same statement. They
-- leave this table only when a write that records them commits. NULL: nothing pending (the hot path
-- reads one NULL).
ALTER TABLE {schema}.job_attempts ADD COLUMN pending_errors jsonb;

-- jobs.errors keeps the last 20 entries: `errors` with `more` (an array; NULL: nothing) appended,
-- the oldest dropped.
CREATE FUNCTION {schema}.append_errors(errors jsonb, more jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
          FROM (SELECT e, n FROM jsonb_array_elements(errors || coalesce(more, '[]'::jsonb)) WITH ORDINALITY AS x(e, n)
                 ORDER BY n DESC LIMIT 20) last);
