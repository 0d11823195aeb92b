-- Every statement of the transactional outbox on MySQL/MariaDB, by name (same format and rules as
-- queries.sql: {outbox}, {outbox_keys} are the quoted table names, every value a bound parameter,
-- portable SQL only -- MySQL 8.0.1+ and MariaDB 10.6+, no RETURNING --, times UTC_TIMESTAMP(6)).
-- skiplock's own sessions run at READ COMMITTED (queries.sql: session_setup); `put` runs on the
-- caller's connection at whatever isolation it has.

-- name: lock_keys
-- Per-key ordering, writer side (what pg_advisory_xact_lock is on PostgreSQL). In the producer's
-- transaction, before its insert: each key's row in {outbox_keys} is written (inserted, or its
-- used_at updated), so this transaction holds its exclusive row lock until it ends. A second writer
-- of the key waits here -- on the row of the primary key: a record lock, no gap lock, whatever the
-- isolation -- until the first commits or rolls back, and only then gets its ids: within a key, id
-- order is commit order, and the relay delivers in id order. {rows} is `lock_key_row` repeated, the
-- keys' SHA-256 sorted ascending (hex sorts as the bytes do): a multi-row INSERT takes its rows in
-- order, so concurrent multi-key writers lock in the same order and never deadlock each other.
INSERT INTO {outbox_keys} (key_hash, used_at) VALUES {rows}
    ON DUPLICATE KEY UPDATE used_at = UTC_TIMESTAMP(6);

-- name: lock_key_row
-- The key's SHA-256 as hex (bound as text: the asyncio drivers' bytes escaping differs).
(UNHEX(%s), UTC_TIMESTAMP(6))

-- name: put_many
-- One statement for up to PUT_CHUNK messages; AUTO_INCREMENT hands ids out in row order, so ids
-- ascend in input order. A message whose idempotency key is already stored (or repeated earlier in
-- this statement) is not inserted again: ON DUPLICATE KEY UPDATE of nothing (not INSERT IGNORE,
-- which would also turn a refused value into a warning and a skipped row). No RETURNING on MySQL:
-- the ids are read back by idempotency key (`ids_by_idempotency_key`), which also finds the stored
-- message of a repeated key. {rows} is `put_row` repeated, every value bound. Nothing is written for
-- the relays' wake-up: they see a new MAX(id) (`poll`).
INSERT INTO {outbox} (topic, `key`, payload, idempotency_key, max_attempts, available_at, created_at)
VALUES {rows}
    ON DUPLICATE KEY UPDATE id = id;

-- name: put_row
(%s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))

-- name: ids_by_idempotency_key
-- In the producer's transaction: its own rows and committed ones (a concurrent put of the same key
-- made our insert wait on the unique key until it ended, so it is committed or gone by now).
-- {keys} is `%s` repeated, one per key (positional: the asyncio drivers do not bind a list).
SELECT id, idempotency_key FROM {outbox} WHERE idempotency_key IN ({keys});

-- name: expired_leases
-- Claimed lease, rescuer, step 1: a relay that crashed or stalled past its lease never reported an
-- outcome. Its rows, locked without waiting (rows another relay is rescuing or finishing right now
-- are skipped: taken next pass). Runs at the start of every claim transaction: one index probe of
-- outbox_lease (state, lease_expires_at) when nothing expired. No ORDER BY: every expired row is
-- rescued (up to 1000 a pass), and MariaDB would sort -- lock every candidate first -- for one.
SELECT id FROM {outbox} FORCE INDEX (outbox_lease)
 WHERE state = 'delivering' AND lease_expires_at < UTC_TIMESTAMP(6)
 LIMIT 1000
   FOR UPDATE SKIP LOCKED;

-- name: rescue
-- Step 2, the rows locked above: back to pending (the delivery may or may not have happened:
-- redelivery is the at-least-once promise, the receiver's dedup makes it harmless), or to failed once
-- their last attempt is used up, so a message that crashes every relay does not loop forever. A
-- single-table UPDATE assigns left to right: last_error reads `owner` before it is cleared.
UPDATE {outbox}
   SET state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END,
       finished_at = CASE WHEN attempts >= max_attempts THEN UTC_TIMESTAMP(6) END,
       available_at = UTC_TIMESTAMP(6),  -- the claim in this same transaction can take it at once
       last_error = CONCAT('lease of relay ', owner, ' expired before it reported an outcome (it crashed, stalled ',
                           'or lost its connection); the message may have been delivered'),
       owner = NULL, lease_expires_at = NULL
 WHERE id IN %(ids)s AND state = 'delivering';

-- name: claim
-- Both lease modes claim with this one statement, so they select alike: up to `limit` available
-- pending rows that no other relay has locked (SKIP LOCKED: never wait, never take the same row),
-- earliest available first. outbox_claim is (state, available_at, id): the equality filter, then
-- exactly the ORDER BY, so the scan reads candidates in order and stops at LIMIT -- no filesort (a
-- filesort would read and lock-test every candidate first and serialise the relays); FORCE INDEX so
-- the optimiser never picks a full scan on a small or skewed table. Topics are checked on each row
-- in order (%(all_topics)s = 1: every topic; %(topics)s is then a placeholder list).
-- Per-key ordering: a keyed message is claimable only if no earlier message with its key is pending
-- or delivering (outbox_key), so a key has at most one message in flight, delivered in id (= commit,
-- see lock_keys) order; a failed (dead-lettered) message does not hold its key up. The subquery is
-- a plain read (a locking read's subqueries do not lock; it never waits on a held row), with the
-- statement's snapshot -- which, unlike the locking outer scan, does not see rows committed while the
-- statement runs: `blocked_by_key` checks the claimed rows again with a fresh snapshot.
-- The SELECT returns the locked rows' latest committed versions; nothing is updated by the claim
-- itself (no UPDATE … RETURNING): a claimed lease then runs `lease`, a transaction lease keeps the
-- rows 'pending' and locked by its open transaction while the sink runs.
SELECT o.id, o.topic, o.`key`, o.payload, o.idempotency_key, o.attempts, o.max_attempts, o.created_at
  FROM {outbox} o FORCE INDEX (outbox_claim)
 WHERE o.state = 'pending' AND o.available_at <= UTC_TIMESTAMP(6)
   AND (%(all_topics)s = 1 OR o.topic IN %(topics)s)
   AND (o.key_hash IS NULL OR NOT EXISTS (
           SELECT 1 FROM {outbox} p
            WHERE p.key_hash = o.key_hash AND p.state IN ('pending', 'delivering') AND p.id < o.id))
 ORDER BY o.available_at, o.id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: blocked_by_key
-- After `claim`, in its transaction: the claimed keyed rows that do have an earlier pending or
-- delivering message of their key, read with a snapshot taken now (a plain read at READ COMMITTED).
-- The claim's subquery may have read an older snapshot than its locking scan: a key's message N and
-- N+1 committed while the claim ran, and N+1 looked free. N committed before N+1 (lock_keys), and
-- N+1 was visible to the claim, so N is visible here in its state as of now: pending or delivering
-- (here or elsewhere) drops N+1 from the batch (it stays pending; under a transaction lease it stays
-- locked until the batch ends).
SELECT o.id FROM {outbox} o
 WHERE o.id IN %(ids)s AND o.key_hash IS NOT NULL
   AND EXISTS (SELECT 1 FROM {outbox} p
                WHERE p.key_hash = o.key_hash AND p.state IN ('pending', 'delivering') AND p.id < o.id);

-- name: lease
-- Claimed lease (the default for external sinks), in the claim's short transaction, on the rows it
-- locked: pending -> delivering with the batch's owner token and a lease expiry, the attempt
-- counted. The caller commits at once: delivery happens after COMMIT, outside any transaction.
UPDATE {outbox}
   SET state = 'delivering', owner = %(owner)s, attempts = attempts + 1,
       lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
 WHERE id IN %(ids)s AND state = 'pending';

-- name: extend_lease
-- Heartbeat for a batch still being delivered, fenced on the owner token like every other write.
UPDATE {outbox}
   SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
 WHERE id IN %(ids)s AND state = 'delivering' AND owner = %(owner)s;

-- name: finishable
-- Writing a batch's outcomes, step 1: the batch's rows still held in the state it holds them in,
-- locked -- claimed lease 'delivering' + its owner token (a relay whose lease expired and was
-- rescued finds its rows changed and writes nothing; the wait is for a rescuer's or a heartbeat's
-- short statement at most); transaction lease 'pending' + no owner (our own locks). These ids are
-- the ones written (no RETURNING).
SELECT id FROM {outbox} WHERE id IN %(ids)s AND state = %(expect)s AND owner <=> %(owner)s FOR UPDATE;

-- name: finish
-- Step 2: the outcomes (sent / pending after a delay / failed) of the rows step 1 locked, in one
-- statement. {rows} is `finish_row` joined by UNION ALL: (id, state, delay in microseconds, error)
-- per message -- a derived table, portable to MySQL 8 and MariaDB. A multi-table UPDATE assigns in
-- no set order: no assignment here reads a column another one writes. The last %s adds `bump` to
-- attempts (the transaction lease counts its attempt here; the claimed lease did at the claim).
UPDATE {outbox} o JOIN ({rows}) r ON o.id = r.id
   SET o.state = r.state,
       o.attempts = o.attempts + %s,
       o.available_at = CASE WHEN r.state = 'pending'
                             THEN UTC_TIMESTAMP(6) + INTERVAL r.delay_us MICROSECOND ELSE o.available_at END,
       o.finished_at = CASE WHEN r.state IN ('sent', 'failed') THEN UTC_TIMESTAMP(6) END,
       o.last_error = COALESCE(r.error, o.last_error),
       o.owner = NULL, o.lease_expires_at = NULL;

-- name: finish_row
SELECT %s AS id, %s AS state, %s AS delay_us, %s AS error

-- name: savepoint
-- Transactional sinks: a failing message is rolled back alone; the batch's row locks are kept.
SAVEPOINT skiplock_outbox;

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT skiplock_outbox;

-- name: release_savepoint
RELEASE SAVEPOINT skiplock_outbox;

-- name: get_message
SELECT id, topic, `key`, payload, idempotency_key, state, attempts, max_attempts, available_at, created_at,
       finished_at, owner, lease_expires_at, last_error
  FROM {outbox}
 WHERE id = %(id)s;

-- name: list_messages
SELECT id, topic, `key`, payload, idempotency_key, state, attempts, max_attempts, available_at, created_at,
       finished_at, owner, lease_expires_at, last_error
  FROM {outbox}
 WHERE (%(state)s IS NULL OR state = %(state)s)
   AND (%(topic)s IS NULL OR topic = %(topic)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: counts
SELECT topic, state, COUNT(*) AS n
  FROM {outbox}
 GROUP BY topic, state
 ORDER BY topic, state;

-- name: states_of
SELECT id, state FROM {outbox} WHERE id IN %(ids)s;

-- name: failed_to_redrive
-- Redrive, step 1 (one transaction): the dead letters asked for (%(all_ids)s = 1: every one, of
-- %(topic)s if given), locked, read from outbox_finished (state, finished_at): the optimiser left to
-- itself picks another index led by state and sorts (EXPLAIN: "Using filesort"). No ORDER BY: two
-- redrives locking in different orders may deadlock (1213): the store retries. Guarded on 'failed':
-- a message pending, in flight or sent is left alone.
SELECT id FROM {outbox} FORCE INDEX (outbox_finished)
 WHERE state = 'failed'
   AND (%(all_ids)s = 1 OR id IN %(ids)s)
   AND (%(topic)s IS NULL OR topic = %(topic)s)
   FOR UPDATE;

-- name: redrive
-- Step 2: back to pending with a fresh set of attempts, due now (the last error is kept for the record).
UPDATE {outbox}
   SET state = 'pending', attempts = 0, available_at = UTC_TIMESTAMP(6), finished_at = NULL
 WHERE id IN %(ids)s AND state = 'failed';

-- name: prune_sent
-- Retention: sent messages finished longer ago than `age`, in bounded batches, read in order from
-- outbox_finished (state, finished_at) -- forced: on a table with few sent rows the optimiser picks
-- another index led by state and sorts -- and locked without waiting (no relay holds a sent row; a
-- finishing write committing right now is taken next time). Deleted by `forget_sent` in the same
-- transaction (a single-table DELETE takes no index hint). Their idempotency keys go with them, so a
-- producer re-putting one of those keys later stores it anew.
SELECT id FROM {outbox} FORCE INDEX (outbox_finished)
 WHERE state = 'sent' AND finished_at < UTC_TIMESTAMP(6) - INTERVAL %(age_us)s MICROSECOND
 ORDER BY finished_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: forget_sent
DELETE FROM {outbox} WHERE id IN %(ids)s AND state = 'sent';

-- name: stale_keys
-- Key rows not used for longer than the retention, locked without waiting: a producer holding one
-- right now (its put's transaction is open) is skipped, never waited on. Deleted by `forget_keys` in
-- the same transaction; a producer that wants such a key meanwhile waits for that COMMIT, then
-- inserts it anew -- the row is only a lock, no message depends on it.
SELECT key_hash FROM {outbox_keys} FORCE INDEX (outbox_keys_used_at)
 WHERE used_at < UTC_TIMESTAMP(6) - INTERVAL %(age_us)s MICROSECOND
 ORDER BY used_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: forget_keys
DELETE FROM {outbox_keys} WHERE key_hash IN %(hashes)s;

-- name: poll
-- The relays' wake-up (notifications.py): a put commits outbox rows, so MAX(id) grows -- read from
-- the end of the primary key, O(1). The second column stands for the notices a job listener reads
-- (the relays have none).
SELECT (SELECT MAX(id) FROM {outbox}), NULL;
