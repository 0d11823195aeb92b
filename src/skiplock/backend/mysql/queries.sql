-- Every statement skiplock runs against MySQL/MariaDB, by name. {jobs}, {job_attempts}, ... are the
-- quoted table names (backend.py: `names`, a strict validated quoting); values are always bound
-- parameters (PyMySQL's %(name)s; a list binds as a parenthesised list). Literal braces are doubled.
-- Portable SQL only (MySQL 8.0.1+ and MariaDB 10.6+): no RETURNING, no sequences, no MariaDB-only
-- functions. Times: UTC_TIMESTAMP(6) (sessions run with time_zone '+00:00').

-- name: schema_version
SELECT MAX(version) FROM {schema_version};

-- name: session_setup
-- Every skiplock session: UTC, READ COMMITTED (MySQL's default REPEATABLE READ takes gap and
-- next-key locks on the claim's range scan that deadlock with concurrent inserts), and a short lock
-- wait (the claim never waits: SKIP LOCKED; a statement that would wait long is an error, 1205).
-- (Two statements: MySQL 8 names the variable transaction_isolation, MariaDB 10.11 tx_isolation;
-- SET SESSION TRANSACTION ISOLATION LEVEL is the same on both.)
SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = %(lock_wait)s;

-- name: session_isolation
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;

-- name: claim
-- The seed's claim inside the lease transaction: the first available rows in (priority, id) order
-- that no other transaction holds. jobs_claim is (state, queue, priority, id): the equality filters,
-- then exactly the ORDER BY, so the scan reads candidates in order and stops at LIMIT -- no filesort
-- (a filesort would read and lock-test every candidate first and serialise the workers). FORCE
-- INDEX: the optimiser must not pick a full scan on a small or skewed table. SKIP LOCKED skips rows
-- locked by others; our own locks are ours. The lock lasts until the transaction ends: COMMIT
-- (done) or any rollback (exception, KILL, lost connection) ends the lease. Not a global FIFO.
-- The select returns the rows; nothing is updated by the claim itself (no UPDATE … RETURNING).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, UTC_TIMESTAMP(6)
  FROM {jobs} FORCE INDEX (jobs_claim)
 WHERE state = 'queued' AND queue = %(queue)s AND run_at <= UTC_TIMESTAMP(6)
   AND NOT EXISTS (SELECT 1 FROM {paused_queues} WHERE queue = %(queue)s)
 ORDER BY priority, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_tasks
-- `claim` for the worker's registered tasks only (task checked on the row, in claim order).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, UTC_TIMESTAMP(6)
  FROM {jobs} FORCE INDEX (jobs_claim)
 WHERE state = 'queued' AND queue = %(queue)s AND task IN %(tasks)s AND run_at <= UTC_TIMESTAMP(6)
   AND NOT EXISTS (SELECT 1 FROM {paused_queues} WHERE queue = %(queue)s)
 ORDER BY priority, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_any_queue
-- Several queues or every queue: jobs_claim_any is (state, priority, id), the ORDER BY after the one
-- equality filter; queue (and task) are checked on each row in order. %(queues)s is NULL-free: the
-- backend passes every queue with `all_queues` = 1 when the worker serves any.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, UTC_TIMESTAMP(6)
  FROM {jobs} FORCE INDEX (jobs_claim_any)
 WHERE state = 'queued' AND run_at <= UTC_TIMESTAMP(6)
   AND (%(all_queues)s = 1 OR queue IN %(queues)s)
   AND (%(all_tasks)s = 1 OR task IN %(tasks)s)
   AND queue NOT IN (SELECT queue FROM {paused_queues})
 ORDER BY priority, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: enqueue_many
-- One multi-row INSERT of up to ENQUEUE_CHUNK jobs: {rows} is `enqueue_row` repeated (placeholders
-- only, every value bound). The ids are LAST_INSERT_ID() .. + n - 1: InnoDB gives a "simple insert"
-- (row count known up front) a consecutive range under innodb_autoinc_lock_mode 0 and 1 (MariaDB's
-- default 1); under 2 (MySQL 8's default, "interleaved") the backend inserts one row per statement.
INSERT INTO {jobs} (queue, task, args, priority, max_attempts, run_at, created_at, errors)
VALUES {rows};

-- name: enqueue_row
(%s, %s, %s, %s, %s, COALESCE(%s, UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6), '[]')

-- name: enqueue_unique
-- One job holding %(unique_key)s while it is active (queued or running: jobs_active_key). A second
-- enqueue of a held key inserts nothing (INSERT IGNORE of the duplicate key only: the key is the
-- sole unique index besides the id) and the holder is read back.
INSERT IGNORE INTO {jobs} (queue, task, args, priority, max_attempts, run_at, created_at, errors, unique_key)
VALUES (%(queue)s, %(task)s, %(args)s, %(priority)s, %(max_attempts)s,
        COALESCE(%(run_at)s, UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6), '[]', %(unique_key)s);

-- name: unique_key_holder
SELECT id, state FROM {jobs} WHERE active_key = %(unique_key)s;

-- name: start_attempt
-- On the slot's autocommit bookkeeping session while the lease holds the job's row lock: it touches
-- only job_attempts (and reads job_cancellations), so it never waits on that lock and survives the
-- lease's rollback. MySQL applies ON DUPLICATE KEY UPDATE's assignments left to right, each seeing
-- the ones before: `suspect` is computed from the old `started`, then `started`, then `exclusive`.
-- The previous attempt never finished if started counts more than the job's row (%(attempts)s):
-- charged only if it ran exclusive; either way the job is a suspect (it runs alone next).
INSERT INTO {job_attempts} (job_id, started, worker, backend_pid, exclusive, suspect, started_at)
VALUES (%(id)s, %(attempts)s + 1, %(worker)s, %(backend_pid)s, %(exclusive)s, FALSE, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    suspect = (started > %(attempts)s),
    started = CASE WHEN started > %(attempts)s AND NOT exclusive THEN started
                   ELSE GREATEST(started, %(attempts)s) + 1 END,
    exclusive = %(exclusive)s, worker = %(worker)s, backend_pid = %(backend_pid)s,
    started_at = UTC_TIMESTAMP(6);

-- name: attempt_started
SELECT a.started, (SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s), a.suspect
  FROM {job_attempts} a WHERE a.job_id = %(id)s;

-- name: mark_exclusive
UPDATE {job_attempts} SET exclusive = TRUE WHERE job_id = %(id)s AND started = %(attempt)s;

-- name: complete
-- In the lease transaction: guarded on the state we claimed it in (transaction lease: still
-- 'queued', our lock; claimed lease: 'running' and our owner) and on no cancellation requested,
-- so a lost COMMIT reply followed by a failure record cannot turn a finished job back.
UPDATE {jobs}
   SET state = 'done', attempts = %(attempt)s, finished_at = UTC_TIMESTAMP(6), started_at = %(started_at)s,
       result = %(result)s, worker = %(worker)s, owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s
   AND state = CASE WHEN %(owner)s IS NULL THEN 'queued' ELSE 'running' END
   AND owner <=> %(owner)s
   AND NOT EXISTS (SELECT 1 FROM {job_cancellations} WHERE job_id = %(id)s);

-- name: forget_attempts
DELETE FROM {job_attempts} WHERE job_id = %(id)s;

-- name: forget_cancellation
DELETE FROM {job_cancellations} WHERE job_id = %(id)s;

-- name: lock_for_outcome
-- record_outcome's row: in the lease, our own lock (SKIP LOCKED never skips it); from a fresh
-- transaction, skipped without waiting if another session still holds it (the dead session has not
-- exited, or another worker claimed it again).
SELECT id FROM {jobs} WHERE id = %(id)s AND state = 'queued' AND owner IS NULL FOR UPDATE SKIP LOCKED;

-- name: cancellation_reason
SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s;

-- name: record_outcome
-- Writes what the policy decided for a run that did not complete (the row locked above): retry
-- after a delay ('queued'), 'failed' or 'cancelled' (a pending cancellation request decides
-- 'cancelled', in the backend). The error is appended to errors; attempts never go down.
UPDATE {jobs}
   SET state = %(state)s,
       attempts = GREATEST(attempts, %(attempt)s),
       run_at = CASE WHEN %(state)s = 'queued' AND %(delay)s IS NOT NULL
                     THEN UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND ELSE run_at END,
       started_at = %(started_at)s,
       finished_at = CASE WHEN %(state)s = 'queued' THEN NULL ELSE UTC_TIMESTAMP(6) END,
       last_error = COALESCE(%(last_error)s, last_error),
       worker = %(worker)s, owner = NULL, lease_expires_at = NULL,
       errors = CASE WHEN %(error)s IS NULL THEN errors
                     ELSE JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT(
                          'attempt', %(attempt)s, 'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00'),
                          'error', %(error)s, 'worker', %(worker)s)) END
 WHERE id = %(id)s;

-- name: uncount_attempt
UPDATE {job_attempts} SET started = started - 1 WHERE job_id = %(id)s;

-- name: savepoint
SAVEPOINT skiplock_job;

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT skiplock_job;

-- name: release_savepoint
RELEASE SAVEPOINT skiplock_job;

-- name: session_alive
SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %(id)s;

-- name: get_job
-- A transaction-lease job in flight is shown 'running' with the slot and start of its attempt: its
-- row still 'queued', an attempt counted beyond the row's (job_attempts.started > jobs.attempts: not
-- finished), and the lease session that counted it has a transaction open now (INNODB_TRX) -- a
-- killed or rolled-back lease is no longer shown running.
SELECT j.id, j.queue, j.task, j.args, j.priority,
       CASE WHEN j.state = 'queued' AND p.trx_id IS NOT NULL THEN 'running' ELSE j.state END AS state,
       GREATEST(j.attempts, COALESCE(a.started, 0)) AS attempts, j.max_attempts, j.run_at, j.created_at,
       CASE WHEN p.trx_id IS NOT NULL THEN a.started_at ELSE j.started_at END AS started_at, j.finished_at,
       j.last_error, j.errors, j.result,
       CASE WHEN p.trx_id IS NOT NULL THEN a.worker ELSE j.worker END AS worker, j.unique_key, j.lease_expires_at
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
       LEFT JOIN information_schema.INNODB_TRX p
              ON p.trx_mysql_thread_id = a.backend_pid AND j.state = 'queued' AND a.started > j.attempts
 WHERE j.id = %(id)s;

-- name: list_jobs
-- Newest first, a page at a time by keyset (%(before)s: the last id of the previous page).
SELECT j.id, j.queue, j.task, j.args, j.priority,
       CASE WHEN j.state = 'queued' AND p.trx_id IS NOT NULL THEN 'running' ELSE j.state END AS state,
       GREATEST(j.attempts, COALESCE(a.started, 0)) AS attempts, j.max_attempts, j.run_at, j.created_at,
       CASE WHEN p.trx_id IS NOT NULL THEN a.started_at ELSE j.started_at END AS started_at, j.finished_at,
       j.last_error, j.errors, j.result,
       CASE WHEN p.trx_id IS NOT NULL THEN a.worker ELSE j.worker END AS worker, j.unique_key, j.lease_expires_at
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
       LEFT JOIN information_schema.INNODB_TRX p
              ON p.trx_mysql_thread_id = a.backend_pid AND j.state = 'queued' AND a.started > j.attempts
 WHERE (%(state)s IS NULL
        OR (%(state)s = 'running' AND (j.state = 'running' OR p.trx_id IS NOT NULL))
        OR (%(state)s = 'queued' AND j.state = 'queued' AND p.trx_id IS NULL)
        OR (%(state)s NOT IN ('running', 'queued') AND j.state = %(state)s))
   AND (%(queue)s IS NULL OR j.queue = %(queue)s)
   AND (%(task)s IS NULL OR j.task = %(task)s)
   AND (%(before)s IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: counts
-- Jobs by queue and state as get_job shows them (a transaction-lease job in flight is 'running').
SELECT j.queue, CASE WHEN j.state = 'queued' AND p.trx_id IS NOT NULL THEN 'running' ELSE j.state END AS s,
       COUNT(*)
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
       LEFT JOIN information_schema.INNODB_TRX p
              ON p.trx_mysql_thread_id = a.backend_pid AND j.state = 'queued' AND a.started > j.attempts
 GROUP BY j.queue, s
 ORDER BY j.queue, s;

-- name: request_cancel
-- Record a cancellation request (a queued job is then cancelled by `cancel_if_unlocked`; a running
-- one's finishing write turns into 'cancelled'). Only for an unfinished job.
INSERT IGNORE INTO {job_cancellations} (job_id, reason, requested_at)
SELECT id, %(reason)s, UTC_TIMESTAMP(6) FROM {jobs} WHERE id = %(id)s AND state IN ('queued', 'running');

-- name: job_state
SELECT state FROM {jobs} WHERE id = %(id)s;

-- name: cancel_if_unlocked
-- A queued job nobody holds: cancelled now (never waits: a held row is left to its holder, whose
-- finishing write sees the request).
SELECT id FROM {jobs} WHERE id = %(id)s AND state = 'queued' FOR UPDATE SKIP LOCKED;

-- name: cancel_now
UPDATE {jobs}
   SET state = 'cancelled', finished_at = UTC_TIMESTAMP(6),
       last_error = CONCAT('cancelled: ', (SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s))
 WHERE id = %(id)s AND state = 'queued';

-- name: retry_job
-- A failed or cancelled job queued again now, its attempts reset (one whose unique key is held by
-- another active job stays failed: the unique index refuses it, the backend reports False).
UPDATE {jobs}
   SET state = 'queued', attempts = 0, run_at = UTC_TIMESTAMP(6), finished_at = NULL, started_at = NULL
 WHERE id = %(id)s AND state IN ('failed', 'cancelled');

-- name: queue_known
SELECT EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {paused_queues} WHERE queue = %(queue)s);

-- name: pause_queue
INSERT IGNORE INTO {paused_queues} (queue, paused_at) VALUES (%(queue)s, UTC_TIMESTAMP(6));

-- name: resume_queue
DELETE FROM {paused_queues} WHERE queue = %(queue)s;

-- name: paused_queues
SELECT queue FROM {paused_queues} ORDER BY queue;

-- name: prune
-- Finished jobs of one state older than the retention, a small batch at a time (the backend loops):
-- never a queued or running job.
DELETE FROM {jobs}
 WHERE state = %(state)s AND finished_at < UTC_TIMESTAMP(6) - INTERVAL %(age_us)s MICROSECOND
 ORDER BY id
 LIMIT %(batch)s;

-- name: connection_budget
-- How many more sessions the server would let this user open: max_connections less the sessions
-- open now (Threads_connected; MySQL keeps one more for a SUPER/CONNECTION_ADMIN user, not counted
-- here), and the per-user limit (max_user_connections, 0: none) less this user's sessions.
SELECT @@max_connections,
       (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND <> 'Daemon'),
       @@max_user_connections,
       (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)),
       CURRENT_USER(), DATABASE();

-- name: forget_stale_workers
-- Rows of workers that died without deleting theirs go after an hour (never the caller's own).
DELETE FROM {workers} WHERE last_seen < UTC_TIMESTAMP(6) - INTERVAL 1 HOUR AND id <> %(id)s;

-- name: worker_seen
INSERT INTO {workers} (id, name, tasks, queues, host, pid, concurrency, started_at, last_seen)
VALUES (%(id)s, %(name)s, %(tasks)s, %(queues)s, %(host)s, %(pid)s, %(concurrency)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE last_seen = UTC_TIMESTAMP(6), tasks = %(tasks)s, queues = %(queues)s, host = %(host)s,
                        pid = %(pid)s, concurrency = %(concurrency)s;

-- name: worker_gone
DELETE FROM {workers} WHERE id = %(id)s;

-- name: live_workers
SELECT COUNT(*) FROM {workers} WHERE last_seen > UTC_TIMESTAMP(6) - INTERVAL %(live_us)s MICROSECOND;

-- name: expired_leases
-- The rescuer (claimed lease): running jobs whose lease expired, locked without waiting (a row
-- being written by its owner or a heartbeat is taken next pass).
SELECT id, attempts, max_attempts FROM {jobs}
 WHERE state = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)
 ORDER BY id LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: rescue_one
-- An expired claimed lease: back to the queue with its attempt used, or 'failed' with "lease
-- expired" after its last attempt. Fenced on state: only a row still running is rescued.
UPDATE {jobs}
   SET state = %(state)s, owner = NULL, lease_expires_at = NULL,
       finished_at = CASE WHEN %(state)s = 'failed' THEN UTC_TIMESTAMP(6) END,
       last_error = 'LeaseExpired: lease expired',
       errors = JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT('attempt', attempts, 'error', 'LeaseExpired: lease expired',
                                  'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00')))
 WHERE id = %(id)s AND state = 'running';
