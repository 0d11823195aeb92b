-- skiplock's MySQL/MariaDB schema, version 1. {jobs}, {job_attempts}, ... are replaced by the quoted
-- table names (the schema name is their prefix: `skiplock_jobs`, ...; see backend.py's `names`).
-- MySQL has no transactional DDL: a migration is a list of steps ("-- step: name"), each idempotent
-- (CREATE TABLE IF NOT EXISTS: a step cut half-way left nothing or all of its table, and running it
-- again is a no-op), recorded in {migration_steps} when it is done, the version in {schema_version}
-- when all of its steps are. Runs serialised across processes by GET_LOCK (backend.py: migrate).
-- Every index is declared inside its CREATE TABLE (MySQL 8 has no CREATE INDEX IF NOT EXISTS).
-- Timestamps are DATETIME(6) in UTC: every skiplock session sets time_zone = '+00:00'.

-- step: jobs
CREATE TABLE IF NOT EXISTS {jobs} (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    queue            VARCHAR(190) NOT NULL DEFAULT 'default',
    task             VARCHAR(190) NOT NULL,
    args             LONGTEXT     NOT NULL CHECK (JSON_VALID(args)),
    priority         INT          NOT NULL DEFAULT 0,
    state            VARCHAR(16)  NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    attempts         INT          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INT          NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    run_at           DATETIME(6)  NOT NULL,
    created_at       DATETIME(6)  NOT NULL,
    started_at       DATETIME(6)  NULL,
    finished_at      DATETIME(6)  NULL,
    last_error       LONGTEXT     NULL,
    errors           LONGTEXT     NOT NULL CHECK (JSON_VALID(errors)),
    result           LONGTEXT     NULL CHECK (result IS NULL OR JSON_VALID(result)),
    worker           VARCHAR(255) NULL,
    unique_key       VARCHAR(190) NULL,
    owner            CHAR(36)     NULL,
    lease_expires_at DATETIME(6)  NULL,
    -- one active job per unique key: NULL (no key, or finished) is never a duplicate
    active_key       VARCHAR(190) GENERATED ALWAYS AS
                     (CASE WHEN state IN ('queued', 'running') THEN unique_key END) STORED,
    PRIMARY KEY (id),
    -- The claim's indexes: the claim's equality filters, then exactly its ORDER BY (priority, id),
    -- so InnoDB reads candidates in claim order and stops at LIMIT: no filesort, which would lock
    -- every candidate row and serialise the workers (tests/mysql/test_mysql_claim.py EXPLAINs it).
    KEY jobs_claim (state, queue, priority, id),      -- one queue
    KEY jobs_claim_any (state, priority, id),         -- several queues, or every queue
    UNIQUE KEY jobs_active_key (active_key),
    CHECK ((state IN ('done', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: job_attempts
-- Attempts started, written from the slot's autocommit bookkeeping session outside the job's
-- transaction (never waiting on the job's row lock): a worker that dies mid-handler rolls back all
-- it did to the job's row, not this count, so a job that kills its worker still ends 'failed'.
CREATE TABLE IF NOT EXISTS {job_attempts} (
    job_id      BIGINT       NOT NULL PRIMARY KEY,
    started     INT          NOT NULL,
    worker      VARCHAR(255) NULL,
    backend_pid BIGINT       NULL,
    exclusive   BOOLEAN      NOT NULL DEFAULT TRUE,
    suspect     BOOLEAN      NOT NULL DEFAULT FALSE,
    started_at  DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: job_cancellations
CREATE TABLE IF NOT EXISTS {job_cancellations} (
    job_id       BIGINT      NOT NULL PRIMARY KEY,
    reason       LONGTEXT    NOT NULL,
    requested_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: paused_queues
CREATE TABLE IF NOT EXISTS {paused_queues} (
    queue     VARCHAR(190) NOT NULL PRIMARY KEY,
    paused_at DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
