-- skiplock schema, version 5: batched claims.
--
-- A worker that claims several jobs in one transaction runs them one after another, each in its own
-- savepoint, and commits them together. Counting every attempt durably before its handler starts
-- (job_attempts, one autocommit write per job) would cost a commit per job; a batch writes ONE row
-- here instead, on a separate autocommit connection, before its first handler starts, and deletes it
-- in the batch's own transaction. A row that outlives its transaction is therefore the trace of a
-- batch whose transaction was rolled back (a killed worker, a lost connection): the next claim of
-- any of its jobs finds it, and runs that job alone with an individually counted attempt. So a job
-- that crashes its worker is counted and gives up after max_attempts, while its batch-mates are not
-- charged for its crash (each of them pays one solo run).
CREATE TABLE {schema}.job_batches (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ids         bigint[]    NOT NULL,
    worker      text,
    backend_pid integer,
    started_at  timestamptz NOT NULL DEFAULT now()
);
-- One row in, one row out per batch: vacuum by churn.
ALTER TABLE {schema}.job_batches SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
