-- Every statement of the transactional outbox, by name (same format as queries.sql). `{schema}` is
-- replaced with the quoted schema identifier once at load time; values are always bound parameters.

-- name: lock_keys
-- Per-key ordering, writer side. Taken in the producer's transaction before its insert and held to
-- its end, so two transactions writing the same key serialise: the second gets its id only after
-- the first has committed (or rolled back). Within a key, id order is therefore commit order, and
-- the relay can deliver in id order. Keys are locked in hash order so concurrent multi-key writers
-- do not deadlock each other. The prefix carries the schema: two skiplock schemas never collide.
SELECT pg_advisory_xact_lock(h)
  FROM (SELECT DISTINCT hashtextextended(%(prefix)s || k, 0) AS h
          FROM unnest(%(keys)s::text[]) AS k
         ORDER BY h) AS ordered;

-- name: put_many
-- One statement for any number of messages; ids are assigned in input order. A message whose
-- idempotency key is already stored is not inserted again (the caller looks the old one up).
INSERT INTO {schema}.outbox (topic, key, payload, idempotency_key, max_attempts)
SELECT topic, key, payload, idempotency_key, max_attempts
  FROM unnest(%(topics)s::text[], %(keys)s::text[], %(payloads)s::text[]::jsonb[], %(idempotency_keys)s::text[],
              %(max_attempts)s::int[])
       WITH ORDINALITY AS m(topic, key, payload, idempotency_key, max_attempts, n)
 ORDER BY n
    ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

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

-- name: claim_lease
-- Claimed lease (the default for external sinks), in a short transaction that commits at once:
-- lock up to `limit` available pending rows that no other relay has locked (SKIP LOCKED: never
-- wait, never take the same row), move them to 'delivering' with this batch's owner token and a
-- lease expiry, and count the attempt. Delivery happens after COMMIT, outside any transaction.
-- Per-key ordering: a keyed message is claimable only if no earlier message with its key is
-- pending or delivering, so a key has at most one message in flight, delivered in id (= commit,
-- see lock_keys) order. A failed (dead-lettered) message does not hold its key up.
-- The CTE with LIMIT ... FOR UPDATE is an optimisation fence: exactly the locked rows are updated,
-- found by primary key (`= ANY(ARRAY(...))`; a join to the CTE can turn into a scan of the table).
WITH picked AS (
    SELECT o.id
      FROM {schema}.outbox o
     WHERE o.state = 'pending' AND o.available_at <= now()
       AND (%(topics)s::text[] IS NULL OR o.topic = ANY(%(topics)s::text[]))
       AND (o.key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.outbox p
                WHERE p.key = o.key AND p.id < o.id AND p.state IN ('pending', 'delivering')))
     ORDER BY o.available_at, o.id
     LIMIT %(limit)s
       FOR UPDATE OF o SKIP LOCKED)
UPDATE {schema}.outbox o
   SET state = 'delivering', owner = %(owner)s, attempts = o.attempts + 1,
       lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
 WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING o.id, o.topic, o.key, o.payload, o.idempotency_key, o.attempts, o.max_attempts, o.created_at;

-- name: claim_locked
-- Transaction lease (the seed's protocol; always used for transactional sinks): the same
-- selection, but the rows stay 'pending' and locked by this transaction while the sink runs. The
-- transaction's end is the end of the lease: COMMIT with the outcomes, or any rollback (crash,
-- lost connection) and the rows are available again at once. The attempt number is this one's.
SELECT o.id, o.topic, o.key, o.payload, o.idempotency_key, o.attempts + 1, o.max_attempts, o.created_at
  FROM {schema}.outbox o
 WHERE o.state = 'pending' AND o.available_at <= now()
   AND (%(topics)s::text[] IS NULL OR o.topic = ANY(%(topics)s::text[]))
   AND (o.key IS NULL OR NOT EXISTS (
           SELECT 1 FROM {schema}.outbox p
            WHERE p.key = o.key AND p.id < o.id AND p.state IN ('pending', 'delivering')))
 ORDER BY o.available_at, o.id
 LIMIT %(limit)s
   FOR UPDATE OF o SKIP LOCKED;

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
  FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(delays)s::float8[], %(errors)s::text[])
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
