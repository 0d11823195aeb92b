-- skiplock's MySQL/MariaDB schema, version 4: the transactional outbox (docs/outbox.md; statements
-- in outbox.sql). Each step is idempotent (CREATE TABLE IF NOT EXISTS, every index inside it: MySQL 8
-- has no CREATE INDEX IF NOT EXISTS) and recorded in migration_steps once it ran.
--
-- A message is inserted in the producer's own transaction, so it exists only if that transaction
-- commits. Relays claim pending rows with FOR UPDATE SKIP LOCKED (never an `id > last_seen` cursor:
-- AUTO_INCREMENT ids are handed out at INSERT, before COMMIT, so rows commit out of id order and a
-- cursor would step over the late ones).
--
-- States: pending -> delivering (claimed lease: owner + lease_expires_at) -> sent | failed;
-- pending -> sent | failed directly under a transaction lease; failed -> pending by a redrive;
-- delivering -> pending (or failed after the last attempt) when its lease expires.

-- step: outbox
CREATE TABLE IF NOT EXISTS {outbox} (
    id               BIGINT        NOT NULL AUTO_INCREMENT,
    topic            VARCHAR(200)  NOT NULL CHECK (topic <> ''),
    -- ordering key: messages with the same key are delivered one at a time, in commit order. Up to
    -- 1000 characters: too long for an index in utf8mb4, so the indexes use its SHA-256 (key_hash).
    `key`            VARCHAR(1000) NULL,
    key_hash         BINARY(32)    GENERATED ALWAYS AS (UNHEX(SHA2(`key`, 256))) STORED,
    payload          LONGTEXT      NOT NULL CHECK (JSON_VALID(payload)),
    -- travels with every delivery attempt (HTTP: the Idempotency-Key header) so receivers dedupe
    idempotency_key  VARCHAR(200)  NOT NULL CHECK (idempotency_key <> ''),
    state            VARCHAR(16)   NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivering', 'sent', 'failed')),
    attempts         INT           NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INT           NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    available_at     DATETIME(6)   NOT NULL,
    created_at       DATETIME(6)   NOT NULL,
    finished_at      DATETIME(6)   NULL,
    owner            VARCHAR(1000) NULL,
    lease_expires_at DATETIME(6)   NULL,
    last_error       LONGTEXT      NULL,
    PRIMARY KEY (id),
    -- One message per idempotency key: a producer retrying the same put stores it once.
    UNIQUE KEY outbox_idempotency_key (idempotency_key),
    -- The claim's index: its equality filter (state), then exactly its ORDER BY (available_at, id),
    -- so InnoDB reads candidates in claim order and stops at LIMIT: no filesort, which would lock
    -- every candidate row and serialise the relays (tests/mysql/test_mysql_outbox.py EXPLAINs it).
    KEY outbox_claim (state, available_at, id),
    -- Per-key ordering: "is there an earlier unfinished message with my key?" is one index probe.
    KEY outbox_key (key_hash, state, id),
    -- The rescuer finds expired claimed leases without scanning.
    KEY outbox_lease (state, lease_expires_at),
    -- Dead letters (`skiplock outbox --failed`) and retention of sent rows.
    KEY outbox_finished (state, finished_at),
    CHECK ((state = 'delivering') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK ((state IN ('sent', 'failed')) = (finished_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- step: outbox_keys
-- Per-key ordering, writer side: what pg_advisory_xact_lock is on PostgreSQL. A put of a keyed
-- message first writes its key's row here (outbox.sql: lock_keys), in the producer's transaction,
-- and so holds that row's lock until the producer commits or rolls back: two transactions writing
-- one key serialise, and within a key id order is commit order. One row per key ever used (its
-- SHA-256), `used_at` the last put's time; rows unused for longer than the sent-message retention
-- go with `prune` (outbox.sql: stale_keys).
CREATE TABLE IF NOT EXISTS {outbox_keys} (
    key_hash BINARY(32)  NOT NULL PRIMARY KEY,
    used_at  DATETIME(6) NOT NULL,
    KEY outbox_keys_used_at (used_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
