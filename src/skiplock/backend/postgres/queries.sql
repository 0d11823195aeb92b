-- Every statement skiplock runs against PostgreSQL, by name. `{schema}` is replaced with the
-- quoted schema identifier (psycopg.sql.Identifier) once at load time; values are always
-- bound parameters. Literal braces are doubled.

-- name: schema_version
SELECT max(version) FROM {schema}.schema_version;

-- name: claim_one
-- The seed's claim, at READ COMMITTED, inside the job's transaction: the first available row in
-- (priority, id) order that no other transaction has locked. SKIP LOCKED skips row locks held by
-- other workers without waiting; the lock lasts until this transaction ends, so COMMIT (done) or
-- any rollback (exception, kill, lost connection) is the end of the lease. This order is per
-- claim, not a global FIFO: a locked earlier row is skipped. One queue: jobs_claim_idx, in order.
-- claimed_at is the transaction's start: the lease began there.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = %(queue)s AND run_at <= now()
 ORDER BY priority, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED;

-- name: claim_one_of_queues
-- The same over several queues: walks jobs_claim_any_idx in (priority, id) order, filtering queue.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = ANY(%(queues)s) AND run_at <= now()
 ORDER BY priority, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED;

-- name: claim_one_any_queue
-- Every queue: jobs_claim_any_idx, in order.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND run_at <= now()
 ORDER BY priority, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED;

-- name: start_attempt
-- Run on a separate autocommit connection while the job's transaction holds the row lock: it
-- touches only job_attempts, so it never waits on that lock, and it survives the job's rollback.
INSERT INTO {schema}.job_attempts AS a (job_id, started, worker)
VALUES (%(id)s, %(attempts)s + 1, %(worker)s)
ON CONFLICT (job_id) DO UPDATE
   SET started = greatest(a.started, EXCLUDED.started - 1) + 1,
       worker = EXCLUDED.worker, started_at = now()
RETURNING started;

-- name: complete
-- Inside the job's transaction: guarded on the state we claimed it in, so a lost COMMIT reply
-- followed by a failure record can never turn a finished job back.
WITH a AS (DELETE FROM {schema}.job_attempts WHERE job_id = %(id)s)
UPDATE {schema}.jobs
   SET state = 'done', attempts = %(attempt)s, finished_at = clock_timestamp(), started_at = %(started_at)s,
       result = %(result)s::jsonb, worker = %(worker)s
 WHERE id = %(id)s AND state = 'queued';

-- name: record_failure
-- Writes the outcome the retry policy decided (retry after delay, or failed). Normally runs inside
-- the job's own transaction after ROLLBACK TO SAVEPOINT (the handler's effects are gone, the row
-- lock is still ours: SKIP LOCKED never skips our own lock). When the job's connection died it
-- runs in a fresh transaction and never waits: if another worker has already claimed the job
-- again, the row is skipped (that worker's attempt is counted in job_attempts). A job that ends
-- failed takes its final attempt count and leaves job_attempts. Keeps the last 20 errors.
-- Returns the number of rows written (0 or 1).
WITH upd AS (
UPDATE {schema}.jobs
   SET state = %(state)s::text,
       attempts = greatest(attempts, %(attempt)s),
       run_at = CASE WHEN %(delay)s::float8 IS NULL THEN run_at
                     ELSE clock_timestamp() + %(delay)s::float8 * interval '1 second' END,
       started_at = %(started_at)s,
       finished_at = CASE WHEN %(state)s::text = 'queued' THEN NULL ELSE clock_timestamp() END,
       last_error = %(error)s,
       worker = %(worker)s,
       errors = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
                   FROM (SELECT e, n FROM jsonb_array_elements(errors || jsonb_build_array(
                             jsonb_build_object('attempt', %(attempt)s::int, 'at', clock_timestamp(),
                                                'error', %(error)s::text, 'worker', %(worker)s::text)))
                                   WITH ORDINALITY AS x(e, n)
                          ORDER BY n DESC LIMIT 20) last)
 WHERE id = (SELECT id FROM {schema}.jobs WHERE id = %(id)s AND state = 'queued' FOR UPDATE SKIP LOCKED)
RETURNING id, state),
gone AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd WHERE state <> 'queued'))
SELECT count(*) FROM upd;

-- name: enqueue_many
-- One statement for any number of jobs: parallel arrays unnested in order; ids come back in
-- input order.
INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at)
SELECT queue, task, args, priority, max_attempts, coalesce(run_at, now())
  FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(args)s::text[]::jsonb[], %(priorities)s::int[],
              %(max_attempts)s::int[], %(run_ats)s::timestamptz[])
       WITH ORDINALITY AS j(queue, task, args, priority, max_attempts, run_at, n)
 ORDER BY n
RETURNING id;

-- name: enqueue_one
INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at)
VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, %(max_attempts)s, coalesce(%(run_at)s, now()))
RETURNING id;

-- name: get_job
SELECT j.id, j.queue, j.task, j.args, j.priority, j.state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, j.started_at, j.finished_at, j.last_error,
       j.errors, j.result, j.worker
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
 WHERE j.id = %(id)s;

-- name: list_jobs
SELECT j.id, j.queue, j.task, j.args, j.priority, j.state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, j.started_at, j.finished_at, j.last_error,
       j.errors, j.result, j.worker
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
 WHERE (%(state)s::text IS NULL OR j.state = %(state)s)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: counts
SELECT queue, state, count(*) AS n
  FROM {schema}.jobs
 GROUP BY queue, state
 ORDER BY queue, state;

-- name: terminate_backends
-- Ends the given sessions; their open transactions roll back (used to abort in-flight jobs).
SELECT pg_terminate_backend(pid) FROM unnest(%(pids)s::int[]) AS p(pid);

-- name: savepoint
-- Taken right after the claim: a failing handler rolls back to here, which undoes its own
-- effects but keeps the row lock, so the outcome is written before anyone can claim the job again.
SAVEPOINT skiplock_job;

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT skiplock_job;

-- name: migrate_lock
-- Serialises concurrent `migrate` runs (per schema) for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('skiplock.migrate:' || %(schema)s, 0));

-- name: record_version
INSERT INTO {schema}.schema_version (version) VALUES (%(version)s);

-- name: set_transaction_timeout
SELECT set_config('transaction_timeout', %(value)s, false);
