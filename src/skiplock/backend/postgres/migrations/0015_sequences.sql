-- skiplock schema, version 14: sequences (docs/flow-control.md, "Sequences") -- jobs with the same
-- sequence key run one at a time, in enqueue order, across every worker and both lease modes.
--
-- Design: the order is kept by the jobs' states, not by the claim. Of the unfinished jobs of one
-- sequence exactly one -- its head -- is 'queued' (or 'running', or 'failed' while it holds the
-- sequence under the rule 'wait'); every later one is 'blocked'. A blocked job is in no claim index
-- (they are all WHERE state = 'queued'), so no claim ever reads it: the claims are the plain ones,
-- their cost independent of how many jobs or sequences wait. The head is claimed like any job (with
-- its flow limits, if any); its finishing write -- whichever path writes it -- makes the next job
-- the head, in the same transaction (the trigger below).
--
-- Invariants:
-- * job_sequences has a row for a key exactly while the sequence has a head; `head` is its id. The
--   row is locked (FOR UPDATE, or INSERT ... ON CONFLICT DO UPDATE) by every transaction that
--   changes which job is the head or adds a job to the sequence, so these serialise per key:
--   - a new job (INSERT, `sequence_enqueued`) becomes the head if the sequence has none, else
--     'blocked' (it runs after every job of the sequence that took the row before it: for one
--     enqueuer, in the order of its calls; enqueue_many, in input order);
--   - the head leaving for good ('done', 'cancelled', or 'failed' under the rules 'skip' and 'fail':
--     `sequence_moved`) promotes the blocked job with the lowest id to 'queued' and makes it the
--     head -- or deletes the row when none is left. Rule 'fail' first fails every blocked job of the
--     sequence (last_error says which job failed before them).
--   - a failed or cancelled job put back ('queued' again: retry, `sequence_revived`) becomes the head
--     if the sequence has none, else 'blocked' behind the head.
-- * A retry after a failed attempt ('queued' again with a delay), a claimed lease returned by the
--   rescuer ('running' -> 'queued') and a transaction lease rolled back (nothing written) change
--   nothing: the head keeps its place, the next job cannot start before it has finished.
-- * Transaction lease: the head's finishing write and the promotion commit together; a killed
--   worker's rollback leaves the head 'queued', claimable at once. Claimed lease: the head is
--   'running' until its fenced finishing write or the rescuer moves it (at lease expiry).
-- * Lock order: a job's row, then its sequence's row, then blocked jobs' rows; an enqueue locks only
--   the sequence row (a new row is locked by nobody else). A sequence row is held until the locking
--   transaction ends: enqueue sequenced jobs in short transactions (the head's finishing write waits
--   for an enqueuing transaction of the same sequence to end). Two transactions that each lock
--   several sequence rows in different orders -- a batch's finishing write and an enqueue_many over
--   the same sequences, say -- can deadlock; the server then aborts one (a batch runs again, an
--   enqueue raises), never both hang.

ALTER TABLE {schema}.jobs ADD COLUMN sequence text;
ALTER TABLE {schema}.jobs ADD COLUMN sequence_on_failure text
    CHECK (sequence_on_failure IN ('wait', 'skip', 'fail'));

-- 'blocked': a sequenced job waiting for the jobs before it (not finished: no finished_at).
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled', 'blocked')) NOT VALID;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_state_check;

CREATE TABLE {schema}.job_sequences (
    key  text   PRIMARY KEY,
    head bigint NOT NULL
);
ALTER TABLE {schema}.job_sequences SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- The next job of a sequence: one descent (sequence, lowest id) among its blocked jobs.
CREATE INDEX jobs_sequence_blocked_idx ON {schema}.jobs (sequence, id) WHERE state = 'blocked';

-- A new job with a sequence (and a retried one: `sequence_revived`): the head if the sequence has
-- none, else blocked behind it.
CREATE FUNCTION {schema}.sequence_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
BEGIN
    IF NEW.state <> 'queued' THEN
        RETURN NEW;
    END IF;
    INSERT INTO {schema}.job_sequences AS s (key, head) VALUES (NEW.sequence, NEW.id)
    ON CONFLICT (key) DO UPDATE SET head = s.head
    RETURNING s.head INTO h;
    IF h <> NEW.id THEN
        NEW.state := 'blocked';
    END IF;
    RETURN NEW;
END $$;

-- The head left for good: the next blocked job (lowest id) becomes the head -- after failing them all
-- under the rule 'fail'; with none left, the sequence's row goes. A job that is not the head (a
-- blocked job cancelled, or failed by the rule 'fail') changes nothing.
CREATE FUNCTION {schema}.sequence_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
    nxt bigint;
BEGIN
    IF NEW.state = 'failed' AND NEW.sequence_on_failure IS DISTINCT FROM 'skip'
       AND NEW.sequence_on_failure IS DISTINCT FROM 'fail' THEN
        RETURN NULL;  -- 'wait' (the default): the failed head keeps the sequence until retried or cancelled
    END IF;
    SELECT s.head INTO h FROM {schema}.job_sequences s WHERE s.key = NEW.sequence FOR UPDATE;
    IF h IS DISTINCT FROM NEW.id THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'failed' AND NEW.sequence_on_failure = 'fail' THEN
        UPDATE {schema}.jobs j
           SET state = 'failed', finished_at = clock_timestamp(),
               last_error = format('sequence %s: job %s before it failed', NEW.sequence, NEW.id),
               errors = {schema}.append_errors(j.errors, jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempts, 'at', clock_timestamp(),
                   'error', format('sequence %s: job %s before it failed', NEW.sequence, NEW.id))))
         WHERE j.sequence = NEW.sequence AND j.state = 'blocked';
        DELETE FROM {schema}.job_sequences WHERE key = NEW.sequence;
        RETURN NULL;
    END IF;
    UPDATE {schema}.jobs SET state = 'queued'
     WHERE id = (SELECT b.id FROM {schema}.jobs b WHERE b.sequence = NEW.sequence AND b.state = 'blocked'
                  ORDER BY b.id LIMIT 1 FOR UPDATE)
    RETURNING id INTO nxt;
    IF nxt IS NULL THEN
        DELETE FROM {schema}.job_sequences WHERE key = NEW.sequence;
    ELSE
        UPDATE {schema}.job_sequences SET head = nxt WHERE key = NEW.sequence;
        -- wake idle workers at commit, as an enqueue does (a hint: they also poll)
        PERFORM pg_notify('skiplock', 'enqueued:' || TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_sequence_enqueued BEFORE INSERT ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.sequence IS NOT NULL) EXECUTE FUNCTION {schema}.sequence_enqueued();
CREATE TRIGGER jobs_sequence_revived BEFORE UPDATE OF state ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.sequence IS NOT NULL AND NEW.state = 'queued' AND OLD.state IN ('failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.sequence_enqueued();
CREATE TRIGGER jobs_sequence_moved AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.sequence IS NOT NULL AND NEW.state IN ('done', 'cancelled', 'failed')
                       AND OLD.state IN ('queued', 'running', 'failed') AND OLD.state <> NEW.state)
    EXECUTE FUNCTION {schema}.sequence_moved();
