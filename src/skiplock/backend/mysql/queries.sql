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
-- The seed's claim inside the lease transaction: the first available rows in (priority, run_at, id) order
-- that no other transaction holds. jobs_claim is (state, queue, priority, run_at, id): the equality filters,
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
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_tasks
-- `claim` for the worker's registered tasks only (task checked on the row, in claim order).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, UTC_TIMESTAMP(6)
  FROM {jobs} FORCE INDEX (jobs_claim)
 WHERE state = 'queued' AND queue = %(queue)s AND task IN %(tasks)s AND run_at <= UTC_TIMESTAMP(6)
   AND NOT EXISTS (SELECT 1 FROM {paused_queues} WHERE queue = %(queue)s)
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_any_queue
-- Several queues or every queue: jobs_claim_any is (state, priority, run_at, id), the ORDER BY after the one
-- equality filter; queue (and task) are checked on each row in order. %(queues)s is NULL-free: the
-- backend passes every queue with `all_queues` = 1 when the worker serves any.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, UTC_TIMESTAMP(6)
  FROM {jobs} FORCE INDEX (jobs_claim_any)
 WHERE state = 'queued' AND run_at <= UTC_TIMESTAMP(6)
   AND (%(all_queues)s = 1 OR queue IN %(queues)s)
   AND (%(all_tasks)s = 1 OR task IN %(tasks)s)
   AND queue NOT IN (SELECT queue FROM {paused_queues})
 ORDER BY priority, run_at, id
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
-- The previous attempt never finished if started counts more than the job's row (%(attempts)s) and
-- no pending error is kept for it (pending_errors' last entry is that attempt's: it finished, its
-- outcome could not be written yet, see `keep_pending_error`): charged only if it ran exclusive;
-- either way the job is a suspect (it runs alone next). A finished one is charged as usual.
INSERT INTO {job_attempts} (job_id, started, worker, backend_pid, exclusive, suspect, started_at)
VALUES (%(id)s, %(attempts)s + 1, %(worker)s, %(backend_pid)s, %(exclusive)s, FALSE, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    suspect = (started > %(attempts)s
               AND NOT COALESCE(JSON_EXTRACT(pending_errors, CONCAT('$[', JSON_LENGTH(pending_errors) - 1,
                                                                  '].attempt')) = started, FALSE)),
    started = CASE WHEN started > %(attempts)s AND NOT exclusive
                        AND NOT COALESCE(JSON_EXTRACT(pending_errors, CONCAT('$[', JSON_LENGTH(pending_errors) - 1,
                                                                           '].attempt')) = started, FALSE)
                   THEN started
                   ELSE GREATEST(started, %(attempts)s) + 1 END,
    exclusive = %(exclusive)s, worker = %(worker)s, backend_pid = %(backend_pid)s,
    started_at = UTC_TIMESTAMP(6);

-- name: attempt_started
-- What start_attempt returns: the attempt, a cancellation request, the previous attempt's error if
-- it finished but is still pending (pending_errors' last entry is attempt started - 1: if that was
-- the last attempt, the job fails with it), whether the job is a suspect, and whether a batch other
-- than %(batch)s (the live one it runs in, if any) still lists it -- a batch that died: a suspect too.
SELECT a.started, (SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s), a.suspect,
       CASE WHEN JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1, '].attempt'))
                 = a.started - 1
            THEN JSON_UNQUOTE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                    '].error'))) END,
       EXISTS (SELECT 1 FROM {job_batch_jobs} b WHERE b.job_id = %(id)s AND b.batch_id <> COALESCE(%(batch)s, 0))
  FROM {job_attempts} a WHERE a.job_id = %(id)s;

-- name: leave_dead_batches
-- A job found in a dead batch's rows (see `attempt_started`) now runs alone, its attempts counted in
-- job_attempts: the rows of dead batches no longer name it, and its attempt row says suspect.
DELETE FROM {job_batch_jobs} WHERE job_id = %(id)s AND batch_id <> COALESCE(%(batch)s, 0);

-- name: mark_suspect
UPDATE {job_attempts} SET suspect = TRUE WHERE job_id = %(id)s;

-- name: start_batch
-- On the slot's bookkeeping session, in one short transaction, before the batch's first handler:
-- the batch's row (its id: LAST_INSERT_ID), then `batch_jobs` rows naming its jobs. Deleted by the
-- batch's COMMIT (`end_batch`); one that outlives it marks the batch dead.
INSERT INTO {job_batches} (worker, backend_pid, started_at) VALUES (%(worker)s, %(backend_pid)s, UTC_TIMESTAMP(6));

-- name: batch_jobs
-- {rows} is `batch_job_row` repeated, every value bound.
INSERT INTO {job_batch_jobs} (job_id, batch_id) VALUES {rows};

-- name: batch_job_row
(%s, %s)

-- name: batch_suspects
-- Read before the batch's own rows go in: jobs listed by another batch's rows (a live batch never
-- lists a job we claimed: its transaction would still hold the job's lock, so it is a dead one), or
-- counted by job_attempts beyond their row (an attempt run alone that never finished). They run alone.
SELECT DISTINCT b.job_id FROM {job_batch_jobs} b WHERE b.job_id IN %(ids)s
UNION
SELECT a.job_id FROM {job_attempts} a JOIN {jobs} j ON j.id = a.job_id
 WHERE a.job_id IN %(ids)s AND a.started > j.attempts;

-- name: batch_cancellations
SELECT job_id, reason FROM {job_cancellations} WHERE job_id IN %(ids)s;

-- name: forget_dead_batches
-- A suspect about to run alone: the rows of dead batches no longer need to name it (the row of the
-- batch it runs in, %(batch)s, keeps it).
DELETE FROM {job_batch_jobs} WHERE job_id = %(id)s AND batch_id <> %(batch)s;

-- name: dead_batches
-- Rows of batches that never committed, once none of their jobs is queued any more (a live batch's
-- jobs are all queued until its COMMIT, which deletes its row): read first, then deleted by id
-- (MySQL refuses a DELETE whose subquery reads the table it deletes from, 1093).
SELECT b.id FROM {job_batches} b
 WHERE NOT EXISTS (SELECT 1 FROM {job_batch_jobs} x JOIN {jobs} j ON j.id = x.job_id
                    WHERE x.batch_id = b.id AND j.state = 'queued')
 ORDER BY b.id
 LIMIT 1000;

-- name: forget_batches
DELETE b, m FROM {job_batches} b LEFT JOIN {job_batch_jobs} m ON m.batch_id = b.id WHERE b.id IN %(ids)s;

-- name: finishing_rows
-- Every finishing write, once the job's row is ours (our lease's lock, or the row the write just
-- updated): lock the jobs' attempt rows (FOR UPDATE: a pending error being appended right now is
-- waited for, a short statement; none can be appended after, so folding then clearing them drops
-- nothing), and read their pending errors and whether someone waits on the job. (job id, attempt
-- row exists, pending errors or NULL, waited on).
SELECT j.id, a.job_id IS NOT NULL, a.pending_errors, EXISTS (SELECT 1 FROM {job_waiters} w WHERE w.job_id = j.id)
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
 WHERE j.id IN %(ids)s
   FOR UPDATE;

-- name: waited_on
SELECT job_id FROM {job_waiters} WHERE job_id IN %(ids)s;

-- name: notify
-- What pg_notify is on PostgreSQL: a notice per finished job someone waits on, in the finishing
-- write's transaction (visible when it commits). {rows} is `notify_row` repeated.
INSERT INTO {notices} (payload, sent_at) VALUES {rows};

-- name: notify_row
(%s, UTC_TIMESTAMP(6))

-- name: complete_batch
-- Inside a batch's transaction, before its COMMIT: the jobs whose handlers returned without touching
-- the database, written 'done' in one statement, guarded like `complete` (still queued: our locks;
-- no cancellation requested). {rows} is `complete_batch_row` joined by UNION ALL: (id, attempt,
-- result JSON) per job -- a derived table, portable to MySQL 8 and MariaDB (no VALUES ROW / table
-- value constructor). No RETURNING: the ids written are read back by `done_of` (rows we hold, so
-- nothing else changed them); pending errors are folded in after, as for `complete`.
UPDATE {jobs} j JOIN ({rows}) d ON j.id = d.id
   SET j.state = 'done', j.attempts = d.attempt, j.finished_at = UTC_TIMESTAMP(6), j.started_at = %s,
       j.result = d.result, j.worker = %s, j.owner = NULL, j.lease_expires_at = NULL
 WHERE j.state = 'queued' AND j.owner IS NULL
   AND NOT EXISTS (SELECT 1 FROM {job_cancellations} c WHERE c.job_id = j.id);

-- name: complete_batch_row
SELECT %s AS id, %s AS attempt, %s AS result

-- name: done_of
SELECT id FROM {jobs} WHERE id IN %(ids)s AND state = 'done';

-- name: forget_attempts_of
DELETE FROM {job_attempts} WHERE job_id IN %(ids)s;

-- name: end_batch
-- The batch commits: it leaves no trace (its row and its jobs' rows go with its COMMIT).
DELETE b, m FROM {job_batches} b LEFT JOIN {job_batch_jobs} m ON m.batch_id = b.id WHERE b.id = %(batch)s;

-- name: mark_exclusive
UPDATE {job_attempts} SET exclusive = TRUE WHERE job_id = %(id)s AND started = %(attempt)s;

-- name: complete
-- In the lease transaction: guarded on the state we claimed it in (transaction lease: still
-- 'queued', our lock; claimed lease: 'running' and our owner -- an UPDATE at READ COMMITTED reads
-- the last committed version of a row another lease holds and skips it if it does not match, so a
-- fenced-off writer never waits on the new holder) and on no cancellation requested, so a lost
-- COMMIT reply followed by a failure record cannot turn a finished job back. Pending errors are
-- folded in after it (`finishing_rows`, `fold_pending`), in the same transaction.
UPDATE {jobs}
   SET state = 'done', attempts = %(attempt)s, finished_at = UTC_TIMESTAMP(6), started_at = %(started_at)s,
       result = %(result)s, worker = %(worker)s, owner = NULL, lease_expires_at = NULL
 WHERE id = %(id)s
   AND state = CASE WHEN %(owner)s IS NULL THEN 'queued' ELSE 'running' END
   AND owner <=> %(owner)s
   AND NOT EXISTS (SELECT 1 FROM {job_cancellations} WHERE job_id = %(id)s);

-- name: fold_pending
-- A finished job's pending errors (read and locked by `finishing_rows`) join its errors.
UPDATE {jobs}
   SET errors = JSON_MERGE_PRESERVE(errors, %(pending)s), last_error = COALESCE(%(pending_last)s, last_error),
       -- then the last 20 kept (as on PostgreSQL): MySQL applies a single-table UPDATE's assignments
       -- left to right, so this one sees the errors just written; a write adds one entry (pending
       -- errors folded in may add more: each such write drops up to two of the oldest)
       errors = CASE WHEN JSON_LENGTH(errors) > 21 THEN JSON_REMOVE(errors, '$[0]', '$[0]')
                     WHEN JSON_LENGTH(errors) > 20 THEN JSON_REMOVE(errors, '$[0]') ELSE errors END
 WHERE id = %(id)s;

-- name: forget_attempts
DELETE FROM {job_attempts} WHERE job_id = %(id)s;

-- name: forget_cancellation
DELETE FROM {job_cancellations} WHERE job_id = %(id)s;

-- name: lock_for_outcome
-- record_outcome's row: in the lease, our own lock (SKIP LOCKED never skips it); from a fresh
-- transaction, skipped without waiting if another session still holds it (the dead session has not
-- exited, or another worker claimed it again): the error is then kept pending (`keep_pending_error`).
SELECT id FROM {jobs} WHERE id = %(id)s AND state = 'queued' AND owner IS NULL FOR UPDATE SKIP LOCKED;

-- name: lock_claimed_for_outcome
-- Claimed lease: fenced on state and owner (a rescued job is not ours), and waits for the row: only
-- short statements lock a running row (a heartbeat, the rescuer, a cancellation).
SELECT id FROM {jobs} WHERE id = %(id)s AND state = 'running' AND owner = %(owner)s FOR UPDATE;

-- name: still_queued
SELECT 1 FROM {jobs} WHERE id = %(id)s AND state = 'queued';

-- name: lock_attempt_row
-- The appender's lock on the job's attempt row: skipped (never waited on) if a finishing write holds it.
SELECT job_id FROM {job_attempts} WHERE job_id = %(id)s FOR UPDATE SKIP LOCKED;

-- name: keep_pending_error
-- A fresh transaction's outcome for a row locked elsewhere: the error is appended to the attempt
-- row (outside every lease: no rollback takes it back) and folded in by the job's next finishing
-- write that commits.
UPDATE {job_attempts}
   SET pending_errors = JSON_ARRAY_APPEND(COALESCE(pending_errors, '[]'), '$', JSON_OBJECT(
           'attempt', %(attempt)s, 'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00'),
           'error', %(error)s, 'worker', %(worker)s))
 WHERE job_id = %(id)s;

-- name: clear_pending
UPDATE {job_attempts} SET pending_errors = NULL WHERE job_id = %(id)s;

-- name: cancellation_reason
SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s;

-- name: record_outcome
-- Writes what the policy decided for a run that did not complete (the row locked above): retry
-- after a delay ('queued'), 'failed' or 'cancelled' (a pending cancellation request decides
-- 'cancelled', in the backend). Errors still pending (%(pending)s, locked by `finishing_rows`) are
-- appended first, then this write's own entry (%(own)s: not when it is already pending -- recorded
-- exactly once). Claimed lease (%(owner)s given): the attempt given is the row's count (a snooze
-- passes one less); else attempts never go down.
-- Each entry says its attempt, when it ended ('at'), when it started ('started_at': the dashboard
-- shows how long it ran), the error and the worker, as on PostgreSQL.
UPDATE {jobs}
   SET state = %(state)s,
       attempts = CASE WHEN %(owner)s IS NOT NULL THEN %(attempt)s ELSE GREATEST(attempts, %(attempt)s) END,
       run_at = CASE WHEN %(state)s = 'queued' AND %(delay)s IS NOT NULL
                     THEN UTC_TIMESTAMP(6) + INTERVAL %(delay_us)s MICROSECOND ELSE run_at END,
       started_at = %(started_at)s,
       finished_at = CASE WHEN %(state)s = 'queued' THEN NULL ELSE UTC_TIMESTAMP(6) END,
       last_error = COALESCE(%(last_error)s, %(pending_last)s, last_error),
       worker = %(worker)s, owner = NULL, lease_expires_at = NULL,
       errors = CASE WHEN %(own)s = 0 THEN JSON_MERGE_PRESERVE(errors, %(pending)s)
                     ELSE JSON_ARRAY_APPEND(JSON_MERGE_PRESERVE(errors, %(pending)s), '$', JSON_OBJECT(
                          'attempt', %(attempt)s, 'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00'),
                          'started_at', DATE_FORMAT(%(started_at)s, '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00'),
                          'error', %(error)s, 'worker', %(worker)s)) END,
       -- then the last 20 kept (as on PostgreSQL): MySQL applies a single-table UPDATE's assignments
       -- left to right, so this one sees the errors just written; a write adds one entry (pending
       -- errors folded in may add more: each such write drops up to two of the oldest)
       errors = CASE WHEN JSON_LENGTH(errors) > 21 THEN JSON_REMOVE(errors, '$[0]', '$[0]')
                     WHEN JSON_LENGTH(errors) > 20 THEN JSON_REMOVE(errors, '$[0]') ELSE errors END
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
-- finished) whose outcome is not pending (pending_errors' last entry is not that attempt's), and the
-- lease session that counted it has a transaction open now (INNODB_TRX) that began no later than the
-- attempt (trx_started, shown in the session's time zone: UTC) -- a killed or rolled-back lease is no
-- longer shown running. (MySQL's session ids grow, never reused.) Pending errors are shown as recorded.
SELECT j.id, j.queue, j.task, j.args, j.priority,
       CASE WHEN j.state = 'queued' AND p.trx_id IS NOT NULL THEN 'running' ELSE j.state END AS state,
       GREATEST(j.attempts, COALESCE(a.started, 0)) AS attempts, j.max_attempts, j.run_at, j.created_at,
       CASE WHEN p.trx_id IS NOT NULL THEN a.started_at ELSE j.started_at END AS started_at, j.finished_at,
       COALESCE(JSON_UNQUOTE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1, '].error'))),
                j.last_error) AS last_error,
       JSON_MERGE_PRESERVE(j.errors, COALESCE(a.pending_errors, '[]')) AS errors, j.result,
       CASE WHEN p.trx_id IS NOT NULL THEN a.worker ELSE j.worker END AS worker, j.unique_key, j.lease_expires_at
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
       LEFT JOIN information_schema.INNODB_TRX p
              ON p.trx_mysql_thread_id = a.backend_pid AND j.state = 'queued' AND a.started > j.attempts
                 AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
                 AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                        '].attempt')) = a.started, FALSE)
 WHERE j.id = %(id)s;

-- name: list_jobs
-- Newest first, a page at a time by keyset (%(before)s: the last id of the previous page).
SELECT j.id, j.queue, j.task, j.args, j.priority,
       CASE WHEN j.state = 'queued' AND p.trx_id IS NOT NULL THEN 'running' ELSE j.state END AS state,
       GREATEST(j.attempts, COALESCE(a.started, 0)) AS attempts, j.max_attempts, j.run_at, j.created_at,
       CASE WHEN p.trx_id IS NOT NULL THEN a.started_at ELSE j.started_at END AS started_at, j.finished_at,
       COALESCE(JSON_UNQUOTE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1, '].error'))),
                j.last_error) AS last_error,
       JSON_MERGE_PRESERVE(j.errors, COALESCE(a.pending_errors, '[]')) AS errors, j.result,
       CASE WHEN p.trx_id IS NOT NULL THEN a.worker ELSE j.worker END AS worker, j.unique_key, j.lease_expires_at
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
       LEFT JOIN information_schema.INNODB_TRX p
              ON p.trx_mysql_thread_id = a.backend_pid AND j.state = 'queued' AND a.started > j.attempts
                 AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
                 AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                        '].attempt')) = a.started, FALSE)
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
                 AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
                 AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                        '].attempt')) = a.started, FALSE)
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
-- An expired claimed lease: back to the queue with its attempt used, or 'failed' after its last
-- attempt, the lapse recorded ("lease expired"). Fenced on state: only a row still running is rescued.
UPDATE {jobs}
   SET state = %(state)s, owner = NULL, lease_expires_at = NULL, run_at = UTC_TIMESTAMP(6),
       finished_at = CASE WHEN %(state)s = 'failed' THEN UTC_TIMESTAMP(6) END,
       last_error = CONCAT('lease expired: worker ', COALESCE(worker, '?'),
                           ' stopped renewing its lease during attempt ', attempts),
       errors = JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT('attempt', attempts, 'error', 'lease expired',
                                  'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00'),
                                  'worker', worker)),
       -- then the last 20 kept (as on PostgreSQL): MySQL applies a single-table UPDATE's assignments
       -- left to right, so this one sees the errors just written; a write adds one entry (pending
       -- errors folded in may add more: each such write drops up to two of the oldest)
       errors = CASE WHEN JSON_LENGTH(errors) > 21 THEN JSON_REMOVE(errors, '$[0]', '$[0]')
                     WHEN JSON_LENGTH(errors) > 20 THEN JSON_REMOVE(errors, '$[0]') ELSE errors END
 WHERE id = %(id)s AND state = 'running';

-- name: start_claimed
-- Claimed lease: inside the claim transaction, move the row to 'running' with our owner token and a
-- lease, counting the attempt; the caller commits at once, so the attempt is durable before the
-- handler starts. `claimed_attempt` then reads the attempt number and any cancellation request.
UPDATE {jobs}
   SET state = 'running', owner = %(owner)s, attempts = attempts + 1, worker = %(worker)s,
       started_at = UTC_TIMESTAMP(6), lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
 WHERE id = %(id)s AND state = 'queued';

-- name: claimed_attempt
SELECT attempts, (SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s) FROM {jobs} WHERE id = %(id)s;

-- name: heartbeat
-- Extends one lease this worker still owns (fenced on state and owner); rowcount 0: a lost lease.
UPDATE {jobs}
   SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
 WHERE id = %(id)s AND state = 'running' AND owner = %(owner)s;

-- name: cancel_running
-- A claimed-lease job: cancelled directly; the worker's fenced finishing write will be refused.
UPDATE {jobs}
   SET state = 'cancelled', finished_at = UTC_TIMESTAMP(6), owner = NULL, lease_expires_at = NULL,
       last_error = CONCAT('cancelled: ', COALESCE((SELECT reason FROM {job_cancellations} WHERE job_id = %(id)s), ''))
 WHERE id = %(id)s AND state = 'running';

-- name: lease_holders
-- The sessions holding a job's transaction lease now: the lease session recorded when its current
-- attempt started (the row still queued, that attempt unfinished: counted beyond the row and not
-- pending), or the session of a batch whose row lists it, each only while it has a transaction
-- open (INNODB_TRX). MySQL's session ids grow and are not reused, so an id names one session.
SELECT t.trx_mysql_thread_id
  FROM {jobs} j JOIN {job_attempts} a ON a.job_id = j.id
       JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = a.backend_pid
 WHERE j.id = %(id)s AND j.state = 'queued' AND a.started > j.attempts
   AND t.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
UNION
SELECT t.trx_mysql_thread_id
  FROM {job_batch_jobs} m JOIN {job_batches} b ON b.id = m.batch_id
       JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = b.backend_pid
 WHERE m.job_id = %(id)s;

-- name: add_waiter
INSERT IGNORE INTO {job_waiters} (job_id) VALUES (%(id)s);

-- name: remove_waiter
DELETE FROM {job_waiters} WHERE job_id = %(id)s;

-- ==== the read model (src/skiplock/readmodel.py) =============================================
-- Read-only, no locks. "In flight" as `get_job` says it: a claimed-lease row 'running', or a
-- transaction-lease attempt whose lease session has its transaction open (INNODB_TRX, read once per
-- statement in a derived table). A slot is "<worker name>/<slot number>".

-- INNODB_TRX is a cache InnoDB refreshes at most every 0.1 s: a session just KILLed may still be
-- listed there, so each test also asks PROCESSLIST (live) that the session exists.

-- name: running_now
-- Every job in flight, by job id, a page at a time (keyset on %(after)s), with its worker's process
-- from the newest `workers` row of that name.
SELECT r.job_id, j.queue, j.task, r.lease, r.attempt, j.max_attempts,
       REGEXP_REPLACE(r.slot, '/[0-9]+$', '') AS worker,
       CASE WHEN r.slot REGEXP '/[0-9]+$' THEN CAST(SUBSTRING_INDEX(r.slot, '/', -1) AS SIGNED) END AS slot,
       r.since, r.lease_expires_at, w.host, w.pid, w.last_seen, UTC_TIMESTAMP(6) AS read_at
  FROM (SELECT a.job_id, 'transaction' AS lease, a.started AS attempt, a.worker AS slot, a.started_at AS since,
               CAST(NULL AS DATETIME(6)) AS lease_expires_at
          FROM {job_attempts} a JOIN {jobs} j ON j.id = a.job_id
               JOIN information_schema.INNODB_TRX p ON p.trx_mysql_thread_id = a.backend_pid
         WHERE j.state = 'queued' AND a.started > j.attempts AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
           AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                  '].attempt')) = a.started, FALSE)
        UNION ALL
        SELECT id, 'claimed', attempts, worker, started_at, lease_expires_at FROM {jobs} WHERE state = 'running') r
  JOIN {jobs} j ON j.id = r.job_id
  LEFT JOIN {workers} w ON w.id = (SELECT w2.id FROM {workers} w2 WHERE w2.name = REGEXP_REPLACE(r.slot, '/[0-9]+$', '')
                                    ORDER BY w2.last_seen DESC LIMIT 1)
 WHERE (%(after)s IS NULL OR r.job_id > %(after)s)
 ORDER BY r.job_id
 LIMIT %(limit)s;

-- name: batches_in_flight
-- Batches whose transaction is open now (their row is deleted by their COMMIT; the session recorded
-- has a transaction that began no later than the row: the batch's), with how many of their jobs
-- they still hold (still queued). By batch id, keyset on %(after)s.
SELECT b.id, REGEXP_REPLACE(b.worker, '/[0-9]+$', '') AS worker,
       CASE WHEN b.worker REGEXP '/[0-9]+$' THEN CAST(SUBSTRING_INDEX(b.worker, '/', -1) AS SIGNED) END AS slot,
       b.started_at,
       (SELECT COUNT(*) FROM {job_batch_jobs} m JOIN {jobs} j ON j.id = m.job_id
         WHERE m.batch_id = b.id AND j.state = 'queued') AS jobs
  FROM {job_batches} b JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = b.backend_pid
 WHERE t.trx_started <= b.started_at
   AND t.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST) AND (%(after)s IS NULL OR b.id > %(after)s)
 ORDER BY b.id
 LIMIT %(limit)s;

-- name: live_worker_rows
-- Every worker seen within %(live_us)s microseconds, oldest first, keyset on (started_at, id), with
-- how many jobs its slots run now (claimed rows and transaction-lease attempts in flight).
SELECT w.id, w.name, w.host, w.pid, w.tasks, w.queues, w.concurrency, w.started_at, w.last_seen,
       COALESCE(busy.n, 0) AS running, UTC_TIMESTAMP(6) AS read_at
  FROM {workers} w
  LEFT JOIN (SELECT s.name, COUNT(*) AS n
               FROM (SELECT REGEXP_REPLACE(a.worker, '/[0-9]+$', '') AS name
                       FROM {job_attempts} a JOIN {jobs} j ON j.id = a.job_id
                            JOIN information_schema.INNODB_TRX p ON p.trx_mysql_thread_id = a.backend_pid
                      WHERE j.state = 'queued' AND a.started > j.attempts AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
                     UNION ALL
                     SELECT REGEXP_REPLACE(worker, '/[0-9]+$', '') FROM {jobs} WHERE state = 'running') s
              GROUP BY s.name) busy ON busy.name = w.name
 WHERE w.last_seen > UTC_TIMESTAMP(6) - INTERVAL %(live_us)s MICROSECOND
   AND (%(after_started)s IS NULL OR (w.started_at, w.id) > (%(after_started)s, %(after_id)s))
 ORDER BY w.started_at, w.id
 LIMIT %(limit)s;

-- name: failure_classes
-- Failed jobs by queue and error class: the text before the first ':' of last_error's first line
-- (at most 200 characters), else 'other', with the newest failure's time; most frequent first. Only
-- those failed since %(since)s if given.
SELECT queue,
       CASE WHEN last_error REGEXP '^[^:\n]{{1,200}}:' THEN SUBSTRING_INDEX(last_error, ':', 1) ELSE 'other' END AS error_class,
       COUNT(*) AS n, MAX(finished_at) AS last_failed_at
  FROM {jobs}
 WHERE state = 'failed' AND (%(since)s IS NULL OR finished_at >= %(since)s)
 GROUP BY queue, error_class
 ORDER BY n DESC, queue, error_class;

-- name: oldest_ready
-- Per queue, the queued jobs due now that are not in flight: how many, the oldest one's due time and
-- its age in microseconds, and whether the queue is paused.
SELECT j.queue, COUNT(*) AS ready, MIN(j.run_at) AS oldest_run_at,
       TIMESTAMPDIFF(MICROSECOND, MIN(j.run_at), UTC_TIMESTAMP(6)) AS age_us,
       EXISTS (SELECT 1 FROM {paused_queues} q WHERE q.queue = j.queue) AS paused
  FROM {jobs} j
  LEFT JOIN (SELECT a.job_id FROM {job_attempts} a JOIN {jobs} x ON x.id = a.job_id
                    JOIN information_schema.INNODB_TRX p ON p.trx_mysql_thread_id = a.backend_pid
              WHERE x.state = 'queued' AND a.started > x.attempts AND p.trx_started <= a.started_at
                 AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)) f
         ON f.job_id = j.id
 WHERE j.state = 'queued' AND j.run_at <= UTC_TIMESTAMP(6) AND f.job_id IS NULL
 GROUP BY j.queue
 ORDER BY j.queue;

-- name: untakeable
-- Queued jobs no live worker can take, by queue and task: no worker seen within %(live_us)s
-- microseconds has the task registered and serves the queue (queues NULL: every queue). Advisory.
SELECT q.queue, q.task, q.n
  FROM (SELECT queue, task, COUNT(*) AS n FROM {jobs} WHERE state = 'queued' GROUP BY queue, task) q
 WHERE NOT EXISTS (SELECT 1 FROM {workers} w
                    WHERE w.last_seen > UTC_TIMESTAMP(6) - INTERVAL %(live_us)s MICROSECOND
                      AND JSON_CONTAINS(w.tasks, JSON_QUOTE(q.task))
                      AND (w.queues IS NULL OR JSON_CONTAINS(w.queues, JSON_QUOTE(q.queue))))
 ORDER BY q.queue, q.task;

-- name: failed_jobs
-- retry_failed, step 1 (one transaction): every failed job (of a queue) in id order, locked, with
-- the active job holding its unique key if any (jobs_active_key: one per key).
SELECT j.id, j.unique_key, (SELECT h.id FROM {jobs} h WHERE h.active_key = j.unique_key) AS holder
  FROM {jobs} j
 WHERE j.state = 'failed' AND (%(queue)s IS NULL OR j.queue = %(queue)s)
 ORDER BY j.id
   FOR UPDATE;

-- name: retry_these
-- Step 2: the failed jobs whose key is free (the lowest id of each key: as if retried one by one in
-- id order) queued again with fresh attempts, their errors kept. A holder committed after step 1
-- makes this fail on jobs_active_key (1062): the backend rolls back and runs both steps again.
UPDATE {jobs}
   SET state = 'queued', attempts = 0, run_at = UTC_TIMESTAMP(6), finished_at = NULL, started_at = NULL,
       result = NULL
 WHERE id IN %(ids)s AND state = 'failed';

-- name: insert_tick
-- Cron: whoever inserts the (schedule, tick) row enqueues that tick's job, in the same transaction
-- (INSERT IGNORE of the primary key only: a second scheduler's insert waits for the first one's
-- commit or rollback on the key, then inserts nothing or takes over).
INSERT IGNORE INTO {periodic_ticks} (schedule, tick) VALUES (%(schedule)s, %(tick)s);

-- name: set_tick_job
UPDATE {periodic_ticks} SET job_id = %(job_id)s WHERE schedule = %(schedule)s AND tick = %(tick)s;

-- name: last_tick
SELECT MAX(tick) FROM {periodic_ticks} WHERE schedule = %(schedule)s;

-- name: prune_ticks
DELETE FROM {periodic_ticks} WHERE tick < UTC_TIMESTAMP(6) - INTERVAL %(age_us)s MICROSECOND;

-- name: prune_notices
-- Notices are read by listeners within their poll interval; a minute is plenty.
DELETE FROM {notices} WHERE sent_at < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND;

-- name: poll
-- A listener's one statement per poll (notifications.py): the first row is (MAX(jobs.id),
-- MAX(notices.id)) -- each read from the end of its primary key, O(1) -- then, when %(want)s, the
-- notices after %(after)s and those of the last two seconds (a lower id that committed after a
-- higher one was read; the listener drops the ones it has seen).
SELECT (SELECT MAX(id) FROM {jobs}), (SELECT MAX(id) FROM {notices})
UNION ALL
SELECT id, payload FROM {notices}
 WHERE %(want)s = 1 AND (id > %(after)s OR sent_at >= UTC_TIMESTAMP(6) - INTERVAL 2 SECOND);

-- name: audit_write
-- The dashboard's audit log (migration 5): one row per action, written after it. No RETURNING: the
-- id is LAST_INSERT_ID() of this statement (the backend reads the cursor's lastrowid).
INSERT INTO {audit_log} (at, actor, action, target, affected)
VALUES (UTC_TIMESTAMP(6), %(actor)s, %(action)s, %(target)s, %(affected)s);

-- name: audit_rows
-- The audit log newest first, keyset on id < %(before)s, at most %(limit)s.
SELECT id, at, actor, action, target, affected
  FROM {audit_log}
 WHERE (%(before)s IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- ==== the dashboard's reads and writes (skiplock.dashboard; Python in reads.py) ================
-- As PostgreSQL's `dash_*` statements (backend/postgres/queries.sql), with the same filters and
-- results. Every statement here runs with the dashboard's statement time limit set on its session
-- (`dash_timeout_*`: MariaDB's max_statement_time, MySQL 8's max_execution_time -- reads.py picks the
-- one the server has, and puts the session's default back after), is bounded by a LIMIT, pages by
-- keyset (never OFFSET), and reads INNODB_TRX/PROCESSLIST at most once per statement (the derived
-- table `f` of the transaction-lease attempts in flight, as `oldest_ready` does), never per row.

-- name: dash_timeout_variable
-- Which statement time limit the server has: max_statement_time (MariaDB: seconds, every statement)
-- or max_execution_time (MySQL 8: milliseconds, read-only SELECTs only).
SHOW VARIABLES WHERE Variable_name IN ('max_statement_time', 'max_execution_time');

-- name: dash_timeout_mariadb
-- The next statements of this session are ended by the server past %(seconds)s seconds (error 1969).
SET SESSION max_statement_time = %(seconds)s;

-- name: dash_timeout_mariadb_reset
SET SESSION max_statement_time = DEFAULT;

-- name: dash_timeout_mysql
-- The next SELECTs of this session are ended by the server past %(ms)s milliseconds (error 3024).
SET SESSION max_execution_time = %(ms)s;

-- name: dash_timeout_mysql_reset
SET SESSION max_execution_time = DEFAULT;

-- name: dash_throughput
-- Jobs finished in the last %(seconds_us)s microseconds, per minute: done, failed, cancelled. Three
-- ranges of jobs_finished (state, finished_at; migration 6), one per finished state, so it reads only
-- the jobs finished in that window, whatever the table's size; at most seconds/60 + 1 rows. The minute
-- is finished_at truncated (whole minutes since a fixed origin, added back: portable to MySQL 8; a
-- TIMESTAMP literal, so the result is a DATETIME, not a string).
SELECT TIMESTAMPADD(MINUTE, TIMESTAMPDIFF(MINUTE, TIMESTAMP '2000-01-01 00:00:00', finished_at),
                    TIMESTAMP '2000-01-01 00:00:00') AS minute,
       SUM(state = 'done') AS done, SUM(state = 'failed') AS failed, SUM(state = 'cancelled') AS cancelled
  FROM {jobs} FORCE INDEX (jobs_finished)
 WHERE state IN ('done', 'failed', 'cancelled')
   AND finished_at >= UTC_TIMESTAMP(6) - INTERVAL %(seconds_us)s MICROSECOND
 GROUP BY minute
 ORDER BY minute;

-- name: dash_pickup_latency
-- Queue latency of the jobs finished in the last %(seconds_us)s microseconds, as PostgreSQL's: from
-- when each became due (run_at) to when its last attempt started (started_at), in seconds, never
-- below 0. No percentile_cont on MySQL 8 (MariaDB has it only as a window function): the waits are
-- ranked (a window function, both servers) and only the rows at the ranks the median, the 95th
-- percentile and the worst need are returned -- at most five rows (rank, how many, wait); the
-- caller interpolates between the two rows around each position, exactly as percentile_cont does.
-- The jobs read are a range of jobs_finished, as `dash_throughput`: bounded by that window's jobs.
WITH waits AS (
  SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, run_at, started_at), 0) / 1000000 AS w
    FROM {jobs} FORCE INDEX (jobs_finished)
   WHERE state IN ('done', 'failed', 'cancelled') AND started_at IS NOT NULL
     AND finished_at >= UTC_TIMESTAMP(6) - INTERVAL %(seconds_us)s MICROSECOND),
ranked AS (SELECT w, ROW_NUMBER() OVER (ORDER BY w) - 1 AS i, COUNT(*) OVER () AS n FROM waits)
SELECT i, n, w FROM ranked
 WHERE i IN (FLOOR((n - 1) * 0.5), CEIL((n - 1) * 0.5), FLOOR((n - 1) * 0.95), CEIL((n - 1) * 0.95), n - 1)
 ORDER BY i;

-- name: dash_find_jobs
-- The jobs matching a filter, newest first, keyset on id < %(before)s, at most %(limit)s. Each filter
-- is optional (NULL: any). State as the read model shows it (`get_job`): a transaction-lease job in
-- flight (its row says 'queued'; `f` below) is 'running', with its attempt's start, slot and count,
-- and 'queued' leaves it out. error_class: as `failure_classes` computes it. since/until: the job's
-- created_at (since inclusive, until exclusive). args: a case-insensitive substring of the args' JSON
-- text (the column's collation is binary: both sides lowered). id_floor: only ids >= it (an args
-- search reads one window of ids at a time, see `dash_id_floor`; NULL: no floor). FORCE INDEX
-- (PRIMARY): the scan walks the primary key backwards and stops at %(limit)s rows or at id_floor --
-- never a filesort of every row of a state through jobs_claim_any; a filter that matches few rows may
-- read many (the statement time limit bounds it), but not an args search: at most its window of ids.
SELECT j.id, j.queue, j.task,
       CASE WHEN f.job_id IS NOT NULL THEN 'running' ELSE j.state END AS state,
       j.priority, GREATEST(j.attempts, COALESCE(f.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at,
       CASE WHEN f.job_id IS NOT NULL THEN f.started_at ELSE j.started_at END AS started_at, j.finished_at,
       LEFT(j.last_error, 300) AS last_error,
       CASE WHEN f.job_id IS NOT NULL THEN f.worker ELSE j.worker END AS worker
  FROM {jobs} j FORCE INDEX (PRIMARY)
  LEFT JOIN (SELECT a.job_id, a.started, a.started_at, a.worker
               FROM {job_attempts} a JOIN {jobs} x ON x.id = a.job_id
                    JOIN information_schema.INNODB_TRX p ON p.trx_mysql_thread_id = a.backend_pid
              WHERE x.state = 'queued' AND a.started > x.attempts AND p.trx_started <= a.started_at
                AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
                AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                                       '].attempt')) = a.started, FALSE)) f
         ON f.job_id = j.id
 WHERE (%(state)s IS NULL
        OR (%(state)s = 'running' AND (j.state = 'running' OR f.job_id IS NOT NULL))
        OR (%(state)s = 'queued' AND j.state = 'queued' AND f.job_id IS NULL)
        OR (%(state)s NOT IN ('running', 'queued') AND j.state = %(state)s))
   AND (%(queue)s IS NULL OR j.queue = %(queue)s)
   AND (%(task)s IS NULL OR j.task = %(task)s)
   AND (%(error_class)s IS NULL
        OR CASE WHEN j.last_error REGEXP '^[^:\n]{{1,200}}:' THEN SUBSTRING_INDEX(j.last_error, ':', 1) ELSE 'other' END
           = %(error_class)s)
   AND (%(since)s IS NULL OR j.created_at >= %(since)s)
   AND (%(until)s IS NULL OR j.created_at < %(until)s)
   AND (%(args)s IS NULL OR LOCATE(LOWER(%(args)s), LOWER(j.args)) > 0)
   AND (%(id_floor)s IS NULL OR j.id >= %(id_floor)s)
   AND (%(before)s IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: dash_id_floor
-- Where an args-text search of the ids below %(before)s (NULL: every id) stops: %(window)s ids down,
-- from the newest id (MAX(id): one probe of the primary key's end). No id is skipped: the next window
-- starts where this one ended (the caller's cursor). Below 1 means the window reaches the first job.
SELECT COALESCE(%(before)s, (SELECT MAX(id) + 1 FROM {jobs}), 1) - %(window)s;

-- name: dash_lock_finished
-- dash_delete_finished, step 1 (one transaction with steps 2 and 3): those of %(ids)s that are
-- finished (done, failed, cancelled) and that no other transaction holds, locked (SKIP LOCKED: a row
-- another transaction holds is skipped, never waited on). A queued or running job is never deleted
-- (cancel it first). No DELETE … RETURNING on MySQL: the ids locked here are the ids deleted.
-- FORCE INDEX (PRIMARY): a lookup of each id; through an index on state (jobs_finished) it would
-- lock-test the other finished rows of the range too.
SELECT id FROM {jobs} FORCE INDEX (PRIMARY)
 WHERE id IN %(ids)s AND state IN ('done', 'failed', 'cancelled')
 ORDER BY id
   FOR UPDATE SKIP LOCKED;

-- name: dash_delete_finished
-- Step 2, once per id step 1 locked (still finished: nobody else can change it until this commits).
-- One id per statement, by primary key equality: a DELETE locks every row it examines, and a
-- DELETE … WHERE id IN (…) on a small table is run as a full scan (no index hint is honoured on a
-- single-table DELETE, nor on MariaDB's one-table multi-table form) -- it would wait on rows other
-- transactions hold.
DELETE FROM {jobs} WHERE id = %(id)s;

-- name: dash_delete_attempts
-- Step 3: its attempt row goes with it, as on PostgreSQL (by primary key, as step 2).
DELETE FROM {job_attempts} WHERE job_id = %(id)s;

-- ==== the dashboard's queue summary: bounded at any table size (reads.py `queue_summary`) ======
-- As PostgreSQL's: exact counts up to a cap, then an estimate; never a scan of every row (a GROUP BY
-- over a table of 1,000,000 jobs reads every index entry). MariaDB has no LATERAL and no outer
-- reference inside a derived table, so the probes and the per-pair capped counts are one short
-- statement each, run by reads.py on one session:
-- * the (state, queue) pairs that have jobs: a loose index scan of jobs_claim (state, queue, …) --
--   one index probe per pair (`dash_queue_pairs`);
-- * each pair counted by a range of jobs_claim stopped after %(cap)s entries (the caller passes the
--   cap + 1, plus the transaction-lease jobs in flight for 'queued'): a count above the cap means
--   "more than the cap", and the caller then asks the optimiser's estimate of that range (EXPLAIN:
--   InnoDB's index dive, no scan);
-- * a transaction-lease job in flight (its row says 'queued') is moved from 'queued' to 'running' by
--   the caller, as `counts` does; the queued pair's count reads that many more entries, so it is
--   still exact up to the cap after the move.

-- name: dash_queue_pairs
-- Every (queue, state) that has jobs: the server's own loose index scan of jobs_claim (state, queue,
-- …) -- "Using index for group-by", one index probe per group, never every entry (a GROUP BY on a
-- prefix of the index with no other column read; MySQL 8 and MariaDB both do it).
SELECT queue, state FROM {jobs} FORCE INDEX (jobs_claim) GROUP BY state, queue;

-- name: dash_in_flight
-- The transaction-lease jobs in flight (as `running_now` says it), with their queue: (queue, job id).
-- As many rows as there are busy slots; INNODB_TRX and PROCESSLIST read once.
SELECT j.queue, a.job_id
  FROM {job_attempts} a JOIN {jobs} j ON j.id = a.job_id
       JOIN information_schema.INNODB_TRX p ON p.trx_mysql_thread_id = a.backend_pid
 WHERE j.state = 'queued' AND a.started > j.attempts AND p.trx_started <= a.started_at
   AND p.trx_mysql_thread_id IN (SELECT ID FROM information_schema.PROCESSLIST)
   AND NOT COALESCE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1,
                                                          '].attempt')) = a.started, FALSE);

-- name: dash_pair_count
-- The jobs of one (state, queue), counted up to %(cap)s: a range of jobs_claim read for at most
-- %(cap)s entries.
SELECT COUNT(*) FROM (SELECT 1 FROM {jobs} FORCE INDEX (jobs_claim)
                       WHERE state = %(state)s AND queue = %(queue)s LIMIT %(cap)s) capped;

-- name: dash_pair_estimate
-- The optimiser's estimate of one (state, queue)'s jobs (the 'rows' of its plan: an index dive into
-- jobs_claim, no scan), for a count above the cap.
EXPLAIN SELECT 1 FROM {jobs} FORCE INDEX (jobs_claim) WHERE state = %(state)s AND queue = %(queue)s;

-- name: dash_ready_count
-- One queue's jobs ready now (queued, due, not in flight: %(in_flight)s, never empty -- 0 stands for
-- none, ids start at 1), counted up to %(cap)s, walking jobs_claim in the claim's order (the ORDER
-- BY says so: no filesort, and the scan stops at %(cap)s).
SELECT COUNT(*) FROM (SELECT 1 FROM {jobs} FORCE INDEX (jobs_claim)
                       WHERE state = 'queued' AND queue = %(queue)s AND run_at <= UTC_TIMESTAMP(6)
                         AND id NOT IN %(in_flight)s
                       ORDER BY priority, run_at, id LIMIT %(cap)s) capped;

-- name: dash_queue_head
-- The head of one queue: the ready job a worker claims next (first in the claim's order on
-- jobs_claim, one probe plus the entries ahead of it of jobs in flight or, at a more urgent priority,
-- not yet due -- the claim's own cost), its due time and how long it has waited, in microseconds.
SELECT run_at, TIMESTAMPDIFF(MICROSECOND, run_at, UTC_TIMESTAMP(6))
  FROM {jobs} FORCE INDEX (jobs_claim)
 WHERE state = 'queued' AND queue = %(queue)s AND run_at <= UTC_TIMESTAMP(6) AND id NOT IN %(in_flight)s
 ORDER BY priority, run_at, id
 LIMIT 1;

-- name: keyed_savepoint
-- enqueue_many with unique keys (producing.py, `_keyed_on`): the call is undone as a whole when an
-- item with on_conflict="raise" meets a holder, leaving the caller's transaction as it was.
SAVEPOINT skiplock_keyed;

-- name: keyed_rollback
ROLLBACK TO SAVEPOINT skiplock_keyed;

-- name: keyed_release
RELEASE SAVEPOINT skiplock_keyed;

-- ==== skiplock.testing (testing.py): on the test's own connection, in its rolled-back transaction

-- name: inline_savepoint
SAVEPOINT skiplock_inline;

-- name: inline_rollback
ROLLBACK TO SAVEPOINT skiplock_inline;

-- name: inline_release
RELEASE SAVEPOINT skiplock_inline;

-- name: inline_finish
-- run_inline: the job it enqueued in the caller's transaction and ran there ends as a worker's
-- successful first run would -- done, attempt 1, with its result. Guarded on 'queued' like every
-- finishing write (the handler itself may have finished or cancelled its row).
UPDATE {jobs}
   SET state = 'done', attempts = 1, started_at = %(started_at)s, finished_at = UTC_TIMESTAMP(6),
       result = %(result)s, worker = %(worker)s
 WHERE id = %(id)s AND state = 'queued';

-- name: inline_jobs
-- assert_enqueued on a connection: the jobs its transaction sees (its own uncommitted ones too), in
-- id order; %(state)s NULL means every state.
SELECT j.id, j.queue, j.task, j.args, j.priority, j.state,
       GREATEST(j.attempts, COALESCE(a.started, 0)) AS attempts, j.max_attempts, j.run_at, j.created_at,
       j.started_at, j.finished_at,
       COALESCE(JSON_UNQUOTE(JSON_EXTRACT(a.pending_errors, CONCAT('$[', JSON_LENGTH(a.pending_errors) - 1, '].error'))),
                j.last_error) AS last_error,
       JSON_MERGE_PRESERVE(j.errors, COALESCE(a.pending_errors, '[]')) AS errors,
       j.result, j.worker, j.unique_key, j.lease_expires_at
  FROM {jobs} j LEFT JOIN {job_attempts} a ON a.job_id = j.id
 WHERE (%(state)s IS NULL OR j.state = %(state)s)
 ORDER BY j.id;
