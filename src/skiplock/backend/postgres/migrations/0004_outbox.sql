-- skiplock schema, version 4: the transactional outbox (see docs/outbox.md).
--
-- A message is inserted in the producer's own transaction, so it exists only if that transaction
-- commits. Relays claim pending rows with FOR UPDATE SKIP LOCKED (never an `id > last_seen`
-- cursor: identity values are handed out before commit, so rows commit out of id order and a
-- cursor would step over the late ones).
--
-- States: pending -> delivering (claimed lease: owner + lease_expires_at) -> sent | failed;
-- pending -> sent | failed directly under a transaction lease; failed -> pending by a redrive;
-- delivering -> pending (or failed after the last attempt) when its lease expires.
CREATE TABLE {schema}.outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic            text        NOT NULL CHECK (topic <> ''),
    -- ordering key: messages with the same key are delivered one at a time, in commit order
    key              text,
    payload          jsonb       NOT NULL,
    -- travels with every delivery attempt (HTTP: the Idempotency-Key header) so receivers dedupe
    idempotency_key  text        NOT NULL CHECK (idempotency_key <> ''),
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivering', 'sent', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer     NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    available_at     timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    owner            text,
    lease_expires_at timestamptz,
    last_error       text,
    CHECK ((state = 'delivering') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK ((state IN ('sent', 'failed')) = (finished_at IS NOT NULL))
);

-- One message per idempotency key: a producer retrying the same put stores it once.
CREATE UNIQUE INDEX outbox_idempotency_key_idx ON {schema}.outbox (idempotency_key);
-- The claim walks only pending rows, earliest available first; sent rows never enter it.
CREATE INDEX outbox_claim_idx ON {schema}.outbox (available_at, id) WHERE state = 'pending';
-- Per-key ordering: "is there an earlier unfinished message with my key?" is one index probe.
CREATE INDEX outbox_key_idx ON {schema}.outbox (key, id)
    WHERE key IS NOT NULL AND state IN ('pending', 'delivering');
-- The rescuer finds expired claimed leases without scanning.
CREATE INDEX outbox_lease_idx ON {schema}.outbox (lease_expires_at) WHERE state = 'delivering';
-- Dead letters (`skiplock outbox --failed`) and retention of sent rows.
CREATE INDEX outbox_failed_idx ON {schema}.outbox (id) WHERE state = 'failed';
CREATE INDEX outbox_finished_idx ON {schema}.outbox (finished_at) WHERE state = 'sent';

-- Every message is updated a few times (claim, outcome) and then only read or pruned: leave room
-- on each page for the new row versions, and let autovacuum visit early.
ALTER TABLE {schema}.outbox SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
                                 autovacuum_vacuum_insert_scale_factor = 0.05);
