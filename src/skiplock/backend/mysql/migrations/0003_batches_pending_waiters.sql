-- skiplock's MySQL/MariaDB schema, version 3: batched claims, pending errors, waiters, cron ticks,
-- and the notices that stand in for NOTIFY. Each step is idempotent (CREATE ... IF NOT EXISTS; an
-- ADD COLUMN that finds its column already there counts as done: backend.py, `migrate`) and recorded
-- in migration_steps once it ran, so an interrupted migrate resumes where it stopped.

-- step: pending_errors
-- An attempt's error is never lost because its job's row was still locked (the dead lease's session
-- had not exited yet, or another worker claimed the job again): `record_outcome` from a fresh
-- transaction then appends it here (a JSON array of {attempt, at, error, worker}), on the attempt
-- counter's row, outside every lease, and every finishing write folds these entries into
-- jobs.errors / last_error and clears them in the same transaction (it locks this row first, so no
-- entry added meanwhile is dropped). NULL: nothing pending.
ALTER TABLE {job_attempts} ADD COLUMN pending_errors LONGTEXT NULL;

-- step: job_batches
-- Batched claims: a worker that claims several jobs in one transaction runs them one after another
-- and commits them together. One row here (and its jobs in job_batch_jobs), written from the slot's
-- autocommit bookkeeping session before the first handler starts, is deleted by the batch's own
-- COMMIT: a row that outlives its transaction is the trace of a batch that died (KILL, a lost
-- connection). The next claim of any of its jobs finds it: that job runs alone with a counted
-- attempt (`start_batch`'s suspects), so a job that crashes its worker still runs out of attempts,
-- and its batch-mates are not charged for its crash.
CREATE TABLE IF NOT EXISTS {job_batches} (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    worker      VARCHAR(255) NULL,
    backend_pid BIGINT       NULL,
    started_at  DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: job_batch_jobs
-- The jobs of each batch row (MySQL has no arrays): by job first, for "is this job in a dead batch".
CREATE TABLE IF NOT EXISTS {job_batch_jobs} (
    job_id   BIGINT NOT NULL,
    batch_id BIGINT NOT NULL,
    PRIMARY KEY (job_id, batch_id),
    KEY job_batch_jobs_batch (batch_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: job_waiters
-- Jobs someone waits on (App.wait): only their finishing writes send a notice.
CREATE TABLE IF NOT EXISTS {job_waiters} (
    job_id BIGINT NOT NULL PRIMARY KEY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: periodic_ticks
-- Cron: whoever inserts the (schedule, tick) row enqueues that tick's job, in the same transaction.
CREATE TABLE IF NOT EXISTS {periodic_ticks} (
    schedule VARCHAR(190) NOT NULL,
    tick     DATETIME(6)  NOT NULL,
    job_id   BIGINT       NULL,
    PRIMARY KEY (schedule, tick)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: notices
-- What NOTIFY is on PostgreSQL: a finishing write of a job someone waits on inserts its notice here,
-- in its own transaction (so it is visible exactly when the write commits); listeners read the rows
-- after the last id they saw (connections.py: MySQLNotifications). Enqueues write nothing here: a
-- listener sees them as a new MAX(id) of jobs. Rows older than a minute are deleted by listeners.
CREATE TABLE IF NOT EXISTS {notices} (
    id      BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    payload VARCHAR(255) NOT NULL,
    sent_at DATETIME(6)  NOT NULL,
    KEY notices_sent_at (sent_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
