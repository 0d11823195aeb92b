-- skiplock schema, version 3: the claimed lease (opt-in per task, for long or external-effect jobs).
--
-- A short transaction moves the row to 'running' with an owner token and lease_expires_at, and
-- commits; the worker extends the lease by heartbeat; the rescuer returns expired leases to the queue
-- (or to 'failed' after the last attempt). Every finishing write is fenced on state and owner.
ALTER TABLE {schema}.jobs ADD COLUMN owner uuid;
ALTER TABLE {schema}.jobs ADD COLUMN lease_expires_at timestamptz;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_running_has_owner
    CHECK ((state = 'running') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL));

-- The rescuer reads only running rows, oldest lease first.
CREATE INDEX jobs_lease_idx ON {schema}.jobs (lease_expires_at) WHERE state = 'running';
