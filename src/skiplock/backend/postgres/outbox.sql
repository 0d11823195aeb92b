-- Every statement of the transactional outbox, by name (same format as queries.sql). `{schema}` is
-- replaced with the quoted schema identifier once at load time; values are always bound parameters.
-- Array parameters of the per-batch statements are sent in binary (`%(x)b`), as in queries.sql.

-- name: lock_keys
-- Per-key ordering, writer side. Taken in the producer's transaction before its insert and held to
-- its end, so two transactions writing the same key serialise: the second gets its id only after
-- the first has committed (or rolled back). Within a key, id order is therefore commit order, and
-- the relay can deliver in id order. Keys are locked in hash order so concurrent multi-key writers
-- do not deadlock each other. The prefix carries the schema: two skiplock schemas never collide.
SELECT pg_advisory_xact_lock(h)
  FROM (SELECT DISTINCT hashtextextended(%(prefix)s || k, 0) AS h
          FROM unnest(%(keys)b::text[]) AS k
         ORDER BY h) AS ordered;

-- name: put_many
-- One statement for any number of messages; ids are assigned in input order. A message whose
-- idempotency key is already stored is not inserted again (the caller looks the old one up).
-- Wake-up: one NOTIFY on the fixed channel `skiplock` (payload `outbox:<schema>`), delivered only
-- when the writer's transaction commits; identical notifications of one transaction are delivered
-- once, so a transaction putting many messages wakes relays once. A hint only: relays also poll.
-- `wake` NULL sends none (count() still yields the one row the join needs).
WITH ins AS (
INSERT INTO {schema}.outbox (topic, key, payload, idempotency_key, max_attempts)
SELECT topic, key, payload, idempotency_key, max_attempts
  FROM unnest(%(topics)b::text[], %(keys)b::text[], %(payloads)b::text[]::jsonb[], %(idempotency_keys)b::text[],
              %(max_attempts)b::int[])
       WITH ORDINALITY AS m(topic, key, payload, idempotency_key, max_attempts, n)
 ORDER BY n
    ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key),
wake AS (SELECT count(pg_notify('skiplock', w)) FROM (VALUES (%(wake)s::text)) AS v(w) WHERE w IS NOT NULL)
SELECT id, idempotency_key FROM ins, wake;

-- name: store_outbox_traces
-- Tracing on only: the carrier of the put's span for the messages this put inserted (not for one it
-- found already stored under its idempotency key: that one keeps the trace it was put under). Sent in
-- the put's transaction, after put_many; table outbox_traces (migration 14). RETURNING: the put's
-- steps read every statement's rows.
INSERT INTO {schema}.outbox_traces (message_id, carrier)
SELECT id, %(carrier)s::jsonb FROM unnest(%(ids)s::bigint[]) AS id
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id;

-- name: outbox_trace_contexts
-- Tracing on only: the carriers of the messages a relay is about to deliver, for the links of its
-- deliver span. A plain read on the primary key: no lock, nobody waits on it. A message redriven or
-- retried reads its carrier again (it is deleted only with its message).
SELECT message_id, carrier::text FROM {schema}.outbox_traces WHERE message_id = ANY(%(ids)s::bigint[]);

-- name: ids_by_idempotency_key
SELECT id, idempotency_key FROM {schema}.outbox WHERE idempotency_key = ANY(%(idempotency_keys)s::text[]);

-- name: rescue_expired
-- Claimed lease, rescuer: a relay that crashed or stalled past its lease never reported an outcome.
-- Its messages go back to pending (the delivery may or may not have happened: redelivery is the
-- at-least-once promise, the receiver's dedup makes it harmless), or to failed once their last
-- attempt is used up, so a message that crashes every relay does not loop forever. Runs at the
-- start of every claim transaction (any relay rescues; one index probe when nothing expired) and
-- never waits: rows another relay is rescuing or finishing right now are skipped.
UPDATE {schema}.outbox o
   SET state = CASE WHEN o.attempts >= o.max_attempts THEN 'failed' ELSE 'pending' END,
       finished_at = CASE WHEN o.attempts >= o.max_attempts THEN clock_timestamp() END,
       available_at = now(),  -- the claim in this same transaction (same now()) can take it at once
       last_error = 'lease of relay ' || o.owner || ' expired before it reported an outcome (it crashed, stalled '
                    || 'or lost its connection); the message may have been delivered',
       owner = NULL, lease_expires_at = NULL
 WHERE o.id IN (SELECT id FROM {schema}.outbox
                 WHERE state = 'delivering' AND lease_expires_at < now()
                   FOR UPDATE SKIP LOCKED)
   AND o.state = 'delivering'
RETURNING o.id, o.state;

-- name: claim
-- Both lease modes claim with this one statement, so they select alike: up to `limit` available
-- pending rows that no other relay has locked (SKIP LOCKED: never wait, never take the same row),
-- earliest available first. Per-key ordering: a keyed message is claimable only if no earlier
-- message with its key is pending or delivering, so a key has at most one message in flight,
-- delivered in id (= commit, see lock_keys) order. A failed (dead-lettered) message does not hold
-- its key up. What happens to the picked rows depends on `owner`:
-- * claimed lease (`owner` given; the default for external sinks), in a short transaction that
--   commits at once: the rows move to 'delivering' with the batch's owner token and a lease expiry,
--   and the attempt is counted. Delivery happens after COMMIT, outside any transaction. The rows
--   are updated by primary key (`= ANY(ARRAY(...))`; a join to the CTE can turn into a table scan).
-- * transaction lease (`owner` NULL; always used for transactional sinks): the rows stay 'pending'
--   and locked by this transaction while the sink runs; its end is the end of the lease (COMMIT
--   with the outcomes, or any rollback -- crash, lost connection -- and they are available again
--   at once). They are returned from `picked` itself: FOR UPDATE gives the version it locked, which
--   a concurrent commit may have made newer than this statement's snapshot. The attempt number is
--   this one's (counted by `finish`).
-- The CTE with LIMIT ... FOR UPDATE is an optimisation fence: exactly the locked rows are returned.
-- The mode's other branch is a one-time filter that reads nothing.
WITH picked AS (
    SELECT o.id, o.topic, o.key, o.payload, o.idempotency_key, o.attempts, o.max_attempts, o.created_at
      FROM {schema}.outbox o
     WHERE o.state = 'pending' AND o.available_at <= now()
       AND (%(topics)s::text[] IS NULL OR o.topic = ANY(%(topics)s::text[]))
       AND (o.key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.outbox p
                WHERE p.key = o.key AND p.id < o.id AND p.state IN ('pending', 'delivering')))
     ORDER BY o.available_at, o.id
     LIMIT %(limit)s
       FOR UPDATE OF o SKIP LOCKED),
leased AS (
    UPDATE {schema}.outbox o
       SET state = 'delivering', owner = %(owner)s::text, attempts = o.attempts + 1,
           lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
     WHERE %(owner)s::text IS NOT NULL AND o.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.topic, o.key, o.payload, o.idempotency_key, o.attempts, o.max_attempts, o.created_at)
SELECT id, topic, key, payload, idempotency_key, attempts, max_attempts, created_at FROM leased
UNION ALL
SELECT id, topic, key, payload, idempotency_key, attempts + 1, max_attempts, created_at FROM picked
 WHERE %(owner)s::text IS NULL;

-- name: extend_lease
-- Heartbeat for a batch still being delivered, fenced on the owner token like every other write.
UPDATE {schema}.outbox
   SET lease_expires_at = clock_timestamp() + %(lease)s::float8 * interval '1 second'
 WHERE id = ANY(%(ids)s::bigint[]) AND state = 'delivering' AND owner = %(owner)s;

-- name: finish
-- Writes a batch's outcomes (sent / pending after a delay / failed) in one statement, fenced on the
-- state the batch holds its messages in and on its owner token: claimed lease 'delivering' + the
-- token; transaction lease 'pending' + no owner (the rows are locked by our own transaction). A
-- relay whose lease expired and was rescued finds its rows changed and writes nothing; the ids
-- returned are those written. `bump` counts the attempt under a transaction lease.
UPDATE {schema}.outbox o
   SET state = r.state,
       attempts = o.attempts + %(bump)s::int,
       available_at = CASE WHEN r.state = 'pending'
                           THEN clock_timestamp() + r.delay * interval '1 second' ELSE o.available_at END,
       finished_at = CASE WHEN r.state IN ('sent', 'failed') THEN clock_timestamp() END,
       last_error = coalesce(r.error, o.last_error),
       owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)b::bigint[], %(states)b::text[], %(delays)s::float8[], %(errors)b::text[])
       AS r(id, state, delay, error)
 WHERE o.id = r.id AND o.state = %(expect)s::text AND o.owner IS NOT DISTINCT FROM %(owner)s::text
RETURNING o.id;

-- name: savepoint
-- Transactional sinks: a failing message is rolled back alone; the batch's row locks are kept.
SAVEPOINT skiplock_outbox;

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT skiplock_outbox;

-- name: release_savepoint
RELEASE SAVEPOINT skiplock_outbox;

-- name: get_message
SELECT id, topic, key, payload, idempotency_key, state, attempts, max_attempts, available_at, created_at,
       finished_at, owner, lease_expires_at, last_error
  FROM {schema}.outbox
 WHERE id = %(id)s;

-- name: list_messages
SELECT id, topic, key, payload, idempotency_key, state, attempts, max_attempts, available_at, created_at,
       finished_at, owner, lease_expires_at, last_error
  FROM {schema}.outbox
 WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: counts
SELECT topic, state, count(*) AS n
  FROM {schema}.outbox
 GROUP BY topic, state
 ORDER BY topic, state;

-- name: states_of
SELECT id, state FROM {schema}.outbox WHERE id = ANY(%(ids)s::bigint[]);

-- name: redrive
-- Dead letters back to pending with a fresh set of attempts (the last error is kept for the
-- record). Guarded on 'failed': a message that is pending, in flight or sent is left alone.
UPDATE {schema}.outbox
   SET state = 'pending', attempts = 0, available_at = clock_timestamp(), finished_at = NULL
 WHERE state = 'failed'
   AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
   AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
RETURNING id;

-- name: prune_sent
-- Retention: sent messages finished longer ago than `age` seconds, in bounded batches. Their
-- idempotency keys go with them, so a producer re-putting one of those keys later stores it anew.
WITH doomed AS (
    SELECT id FROM {schema}.outbox
     WHERE state = 'sent' AND finished_at < clock_timestamp() - %(age)s::float8 * interval '1 second'
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
DELETE FROM {schema}.outbox o USING doomed WHERE o.id = doomed.id;
