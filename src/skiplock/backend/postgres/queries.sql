-- Every statement skiplock runs against PostgreSQL, by name. `{schema}` is replaced with the
-- quoted schema identifier (psycopg.sql.Identifier) once at load time; values are always
-- bound parameters. Literal braces are doubled. A `-- fragment: x` block is SQL text shared by
-- statements: a line `-- include: x` in a statement is replaced by it (queries.py).
-- Array parameters of the statements that run per batch or per enqueue are sent in binary
-- (`%(x)b`): psycopg writes a text array in Python, quoting every element that holds a quote,
-- a backslash, a comma or a space with a regular expression -- many times the binary form's cost for
-- a job's JSON args or result or a flow key (33 flow keys: 976 against 56 µs; docs/benchmarks.md,
-- "Session 15"). The arrays of a batch's bookkeeping (`start_batch`, `complete_batch`) are cheaper
-- still as one text parameter each, written by queries.py (`int_array`: digits and commas only;
-- `json_array`: the results, already JSON, joined into one JSON array): psycopg's list dumpers look
-- at every element to pick the array's type, about 40 µs of the worker's CPU per batch of 8.

-- name: schema_version
SELECT max(version) FROM {schema}.schema_version;

-- name: connection_budget
-- How many more sessions the server would let this role open on this database, by each limit that
-- applies: max_connections less the slots reserved for superusers and (PostgreSQL 16+) for
-- pg_use_reserved_connections, the role's CONNECTION LIMIT and the database's (neither applies to a
-- superuser; -1 is no limit), each less the client sessions counted against it now (this one included).
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int
         + coalesce(current_setting('reserved_connections', true)::int, 0),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
       CASE WHEN r.rolsuper THEN -1 ELSE r.rolconnlimit END,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND usesysid = r.oid)::int,
       CASE WHEN r.rolsuper THEN -1 ELSE d.datconnlimit END,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datid = d.oid)::int,
       current_user, current_database()
  FROM pg_roles r, pg_database d
 WHERE r.rolname = current_user AND d.datname = current_database();

-- name: claim
-- The seed's claim, at READ COMMITTED, inside the job's transaction: the first available row in
-- (priority, run_at, id) order that no other transaction has locked. SKIP LOCKED skips row locks held by
-- other workers without waiting; the lock lasts until this transaction ends, so COMMIT (done) or
-- any rollback (exception, kill, lost connection) is the end of the lease. This order is per
-- claim, not a global FIFO: a locked earlier row is skipped. One queue: jobs_claim_idx, in order.
-- %(limit)s > 1 claims a batch: the jobs then run one after another in this one transaction, each in
-- its own savepoint, and are released (untouched) at COMMIT if the batch stops early.
-- claimed_at is the transaction's start: the lease began there.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = %(queue)s AND run_at <= now()
   AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s)
   AND NOT EXISTS (SELECT 1 FROM {schema}.queue_limits WHERE queue = %(queue)s)  -- `claim_flow`'s
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_of_queues
-- The same over many given queues (more than queries.py's MERGED_QUEUES_MAX; fewer:
-- `claim_of_queues_merged`): walks jobs_claim_any_idx in (priority, run_at, id) order, filtering
-- queue -- one heap read per job of another queue ahead.
-- `NOT flow` (migration 17): that index holds only the queued jobs without the flag, so the jobs
-- of limited queues waiting ahead are not walked; the test of queue_limits below stays (a job of a
-- limited queue without the flag is the flow claim's, and costs this walk a row).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND NOT flow AND queue = ANY(%(queues)s) AND run_at <= now()
   -- Paused queues, evaluated once per claim. The NOT EXISTS short-circuits the common case (nothing
   -- paused) and keeps the planner's row estimate sane: `queue <> ALL (...)` alone is estimated at
   -- ~1 row when one queue holds all jobs, which turns the claim into a seq scan + sort.
   AND (NOT EXISTS (SELECT FROM {schema}.paused_queues)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.paused_queues)))
   -- A queue with limits (queue_limits) is claimed by `claim_flow` only; the same shape as above.
   AND (NOT EXISTS (SELECT FROM {schema}.queue_limits)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.queue_limits)))
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_queue_walk
-- One queue's part of `claim_of_queues_merged` (its %(queue)s renamed for each queue: queries.py,
-- `claim_of_queues`): the queue's available jobs in claim order, off jobs_claim_idx from the queue's
-- first entry. The tests of a pause and of limits are `claim`'s, each run once per claim: a paused
-- queue or one left to the flow claim is not walked at all. The rows are read on the claim's
-- snapshot and re-checked as they are locked (the including statement's `j`).
-- Its LIMIT returns every row (no walk is ever cut short: a queue whose first rows are all locked by
-- other workers still gives the claim its next one); it is there for the planner. A walk in
-- parentheses is planned as a subquery for all its rows (its including statement sorts and joins),
-- so a busy queue -- its pages not all-visible -- was read whole with a bitmap scan and sorted at
-- every claim. A LIMIT the planner cannot read (a sub-select) makes it plan for a tenth of the rows:
-- the walk of jobs_claim_idx in order, read only as far as the merge takes it
-- (tests/integration/test_claim_of_queues.py).
SELECT ctid, id, priority, run_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = %(queue)s AND run_at <= now()
   AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s)
   AND NOT EXISTS (SELECT 1 FROM {schema}.queue_limits WHERE queue = %(queue)s)
 ORDER BY priority, run_at, id
 LIMIT (SELECT 9223372036854775807)

-- name: claim_tasks_queue_walk
-- `claim_queue_walk` for the worker's tasks only (the task checked on the index entry, as in `claim_tasks`).
SELECT ctid, id, priority, run_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = %(queue)s AND task = ANY(%(tasks)s::text[]) AND run_at <= now()
   AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s)
   AND NOT EXISTS (SELECT 1 FROM {schema}.queue_limits WHERE queue = %(queue)s)
 ORDER BY priority, run_at, id
 LIMIT (SELECT 9223372036854775807)

-- name: claim_of_queues_merged
-- `claim` over a few given queues (queries.py, `claim_of_queues`: up to MERGED_QUEUES_MAX): each
-- queue's own walk (`claim_queue_walk`, or `claim_tasks_queue_walk` for the worker's tasks only),
-- one per queue in place of the comment below, merged in (priority, run_at, id) order (a Merge
-- Append: each walk is read only as far as the merge takes it), each row locked as the merge yields
-- it (the LATERAL subquery `j`: the row read again by its address, `ctid`, and locked FOR UPDATE SKIP
-- LOCKED, per row merged). The invariants are `claim`'s:
-- * SKIP LOCKED, row by row in claim order: a row another transaction holds is skipped and the next
--   one in order is taken, across the queues as within one -- the claim never locks a row it does
--   not return, so nothing is held back by over-locking.
-- * the lock is taken on the row's newest version, re-checked (READ COMMITTED): a job finished or
--   claimed and committed since the snapshot is not taken (`l.state`, `l.run_at`). A row updated
--   and committed since the snapshot has a new address, so the re-check of `l.ctid` fails and this
--   claim skips it even if it is still queued (the next claim sees its new version); a queued row is
--   not updated in place by skiplock's own paths, except by the flag of limits (then it is the flow
--   claim's anyway).
-- * another queue's backlog, or a paused one's, is never walked: each walk starts at its queue's
--   first entry (before: jobs_claim_any_idx in claim order, one heap read per job of another queue
--   ahead -- 10-13 ms per claim behind 50,000; docs/benchmarks.md, "Session 21").
-- The cost: a descent of jobs_claim_idx per queue, and each row merged read twice, on the same page:
-- by the walk (its `ctid`), then by that address to be locked (FOR UPDATE cannot lock through UNION
-- ALL). A lookup by id instead (jobs_pkey) cost about 1.4 x the server time per claim.
-- The plan is held in shape by the statement, not by estimates (tests/integration/test_claim_of_queues.py):
-- * each walk has its own ORDER BY: without it no Merge Append is planned (a UNION ALL member's
--   `queue = $1` is no equivalence class, so the index's order would not start at `priority`);
-- * the lock is in a LATERAL subquery (it has FOR UPDATE: never flattened), so it is a nested loop,
--   one row at a time. A join to the table with FOR UPDATE on the outer query was planned as a hash
--   join over the whole table and a sort once finished jobs filled it (9 ms per claim in a drain).
SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
       now() AS claimed_at
  FROM (/* each queue */) AS c
 CROSS JOIN LATERAL (
       SELECT l.id, l.queue, l.task, l.args, l.priority, l.attempts, l.max_attempts, l.run_at, l.created_at
         FROM {schema}.jobs l
        WHERE l.ctid = c.ctid AND l.state = 'queued' AND l.run_at <= now()
          FOR UPDATE SKIP LOCKED) AS j
 ORDER BY c.priority, c.run_at, c.id
 LIMIT %(limit)s;

-- name: claim_any_queue
-- Every queue: jobs_claim_any_idx, in order (`NOT flow`: as in `claim_of_queues`).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND NOT flow AND run_at <= now()
   -- Paused queues, evaluated once per claim. The NOT EXISTS short-circuits the common case (nothing
   -- paused) and keeps the planner's row estimate sane: `queue <> ALL (...)` alone is estimated at
   -- ~1 row when one queue holds all jobs, which turns the claim into a seq scan + sort.
   AND (NOT EXISTS (SELECT FROM {schema}.paused_queues)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.paused_queues)))
   -- A queue with limits (queue_limits) is claimed by `claim_flow` only; the same shape as above.
   AND (NOT EXISTS (SELECT FROM {schema}.queue_limits)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.queue_limits)))
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_tasks
-- What a worker runs: `claim`, for only the tasks it has handlers for (%(tasks)s, its registered
-- names), so it never takes -- and fails -- another app's jobs. task is the last key of
-- jobs_claim_idx: the filter is checked on index entries as the scan walks them in (priority, run_at, id)
-- order, so a queued job of another task costs an index entry, never a heap fetch (see migration 7).
-- The claims without the filter (`claim`, `claim_of_queues`, `claim_any_queue`) are the opt-in
-- `fail_unknown_tasks` worker's.
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND queue = %(queue)s AND task = ANY(%(tasks)s::text[]) AND run_at <= now()
   AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s)
   AND NOT EXISTS (SELECT 1 FROM {schema}.queue_limits WHERE queue = %(queue)s)  -- `claim_flow`'s
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_tasks_of_queues
-- `claim_of_queues` for the worker's tasks only (over many queues; fewer:
-- `claim_of_queues_merged`): jobs_claim_any_idx in order, the task checked on the index entry
-- (an Index Cond), the queue on the row (`NOT flow`: as in `claim_of_queues`).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND NOT flow AND queue = ANY(%(queues)s) AND task = ANY(%(tasks)s::text[]) AND run_at <= now()
   AND (NOT EXISTS (SELECT FROM {schema}.paused_queues)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.paused_queues)))
   -- A queue with limits (queue_limits) is claimed by `claim_flow` only; the same shape as above.
   AND (NOT EXISTS (SELECT FROM {schema}.queue_limits)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.queue_limits)))
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_tasks_any_queue
-- `claim_any_queue` for the worker's tasks only: jobs_claim_any_idx in order, the task checked on
-- the index entry (an Index Cond; `NOT flow`: as in `claim_of_queues`).
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, now() AS claimed_at
  FROM {schema}.jobs
 WHERE state = 'queued' AND NOT flow AND task = ANY(%(tasks)s::text[]) AND run_at <= now()
   AND (NOT EXISTS (SELECT FROM {schema}.paused_queues)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.paused_queues)))
   -- A queue with limits (queue_limits) is claimed by `claim_flow` only; the same shape as above.
   AND (NOT EXISTS (SELECT FROM {schema}.queue_limits)
        OR queue <> ALL (ARRAY(SELECT queue FROM {schema}.queue_limits)))
 ORDER BY priority, run_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED;

-- name: start_attempt
-- Run on a separate autocommit connection while the job's transaction holds the row lock: it
-- touches only job_attempts, so it never waits on that lock, and it survives the job's rollback.
-- Also says whether a cancellation was requested (then the handler is not run), and the error of the
-- previous attempt if that attempt finished but its outcome could not be written (still pending: see
-- `record_outcome`) -- if that was the job's last attempt, the job fails with that error.
-- The previous attempt never finished if job_attempts counts one more than the job's row
-- (%(attempts)s) and holds no pending error for it: its session died (a killed process, a lost
-- connection). That attempt is charged only if it ran `exclusive` (no other handler of its process
-- running: %(exclusive)s, a one-slot worker; or a suspect's run, see `mark_exclusive`); otherwise it
-- is not counted (its number is used again) -- whichever job killed its process, it need not have
-- been this one. Either way the job is a `suspect`: this attempt runs exclusively in its process, so
-- a crash during it is charged. A job listed by the row of a batch that never committed (see
-- `start_batch`; any row but %(batch)s, the live batch it may be running in) is a suspect too, and
-- is taken off those rows: from now on its attempts are counted here. So a job that kills its worker
-- every time runs at most max_attempts + 1 times, and a job never pays for a crash it shared with
-- other jobs.
WITH dead AS (
UPDATE {schema}.job_batches SET ids = array_remove(ids, %(id)s::bigint)
 WHERE ids @> ARRAY[%(id)s::bigint] AND id IS DISTINCT FROM %(batch)s::bigint
RETURNING id),
a AS (
INSERT INTO {schema}.job_attempts AS a (job_id, started, worker, backend_pid, exclusive, suspect)
VALUES (%(id)s, %(attempts)s + 1, %(worker)s, %(backend_pid)s, %(exclusive)s, EXISTS (SELECT FROM dead))
ON CONFLICT (job_id) DO UPDATE
   SET started = CASE WHEN a.started > EXCLUDED.started - 1 AND NOT a.exclusive
                           AND (a.pending_errors -> -1 ->> 'attempt') IS DISTINCT FROM a.started::text
                      THEN a.started  -- unfinished, shared its process: not charged
                      ELSE greatest(a.started, EXCLUDED.started - 1) + 1 END,
       suspect = EXCLUDED.suspect
                 OR (a.started > EXCLUDED.started - 1
                     AND (a.pending_errors -> -1 ->> 'attempt') IS DISTINCT FROM a.started::text),
       exclusive = EXCLUDED.exclusive,
       worker = EXCLUDED.worker, backend_pid = EXCLUDED.backend_pid, started_at = now()
RETURNING a.started, a.suspect,
          CASE WHEN (a.pending_errors -> -1 ->> 'attempt')::int = a.started - 1
               THEN a.pending_errors -> -1 ->> 'error' END AS unrecorded)
SELECT a.started, (SELECT reason FROM {schema}.job_cancellations WHERE job_id = %(id)s), a.unrecorded, a.suspect
  FROM a;

-- name: mark_exclusive
-- A suspect's attempt (see `start_attempt`) now runs exclusively in its process: if it never
-- finishes, it is charged.
UPDATE {schema}.job_attempts SET exclusive = true WHERE job_id = %(id)s AND started = %(attempt)s;

-- name: start_batch
-- Run on the slot's autocommit bookkeeping connection before the first handler of a batch (several
-- jobs claimed in one transaction) starts: marks the batch with one row (deleted by `complete_batch`
-- in the batch's own transaction) instead of counting every attempt with a commit of its own.
-- Returns the row's id, the suspects among the claimed jobs -- listed by the row of a batch whose
-- transaction never committed (a live batch's row never lists a job we claimed: its transaction
-- still holds that job's lock), or counted by job_attempts for an attempt their row does not record
-- (a run alone that never finished) -- and the cancellation requests. A suspect runs alone.
-- The rows of job_batches are read in ONE pass (a hashed subplan over the rows that share a job
-- with this batch), not once per job: nothing indexes `ids`, every batch inserts a row and deletes
-- it, and until autovacuum comes (the server's autovacuum_naptime, a minute by default) the table's
-- pages hold every batch since -- the per-job EXISTS read them all once per claimed job.
WITH c AS (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS c(id, attempts)),
mark AS (INSERT INTO {schema}.job_batches (ids, worker, backend_pid)
         VALUES (%(ids)s::bigint[], %(worker)s, %(backend_pid)s) RETURNING id)
SELECT (SELECT id FROM mark),
       ARRAY(SELECT c.id FROM c
              WHERE c.id IN (SELECT unnest(b.ids) FROM {schema}.job_batches b WHERE b.ids && %(ids)s::bigint[])
                 OR EXISTS (SELECT 1 FROM {schema}.job_attempts a WHERE a.job_id = c.id AND a.started > c.attempts)),
       ARRAY(SELECT x.job_id FROM {schema}.job_cancellations x WHERE x.job_id = ANY(%(ids)s::bigint[])),
       ARRAY(SELECT x.reason FROM {schema}.job_cancellations x WHERE x.job_id = ANY(%(ids)s::bigint[]));

-- name: forget_dead_batches
-- A suspect about to run alone (its attempt counted in job_attempts from now on): the rows of dead
-- batches no longer need to name it. The row of the batch it runs in (%(batch)s) keeps it.
-- (`start_attempt` does the same in its own statement; this one is kept for the backend seam.)
UPDATE {schema}.job_batches SET ids = array_remove(ids, %(id)s::bigint)
 WHERE ids @> ARRAY[%(id)s::bigint] AND id <> %(batch)s;

-- name: generic_plans
-- Sent, in the same round trip, before a batch's finishing write (`complete_batch`, itself sent with
-- the COMMIT), after its handlers have run: for the rest of the transaction a prepared statement
-- keeps one plan for every value. The server otherwise planned that write anew at almost every run
-- (a plan made for a short array looks cheaper than the generic one), at 0.3-0.5 ms of server CPU
-- each; its plan is keyed lookups whatever the values (tests/integration/test_plans_kept.py). SET
-- LOCAL: it ends with the transaction, so no statement of a handler ever runs under it.
SET LOCAL plan_cache_mode = force_generic_plan;

-- name: complete_batch
-- Inside a batch's transaction, before its COMMIT: the jobs whose handlers returned without touching
-- the database, written 'done' in one statement (guarded like `complete`), and the batch's row
-- deleted (the batch commits, so it leaves no trace). Errors still pending in job_attempts (an
-- earlier attempt's, see `record_outcome`) are folded in as their rows go. Returns the ids written.
-- %(results)s is one JSON array, the i-th job's result its i-th element; a JSON null there is a
-- handler that returned None, written SQL NULL as `complete` writes it.
WITH d AS MATERIALIZED (
SELECT d.*, (SELECT a.pending_errors FROM {schema}.job_attempts a WHERE a.job_id = d.id) AS pending
  FROM ROWS FROM (unnest(%(ids)s::bigint[]), unnest(%(attempts)s::int[]),
                  jsonb_array_elements(%(results)s::jsonb)) AS d(id, attempt, result)),
upd AS (
UPDATE {schema}.jobs j
   SET state = 'done', attempts = d.attempt, finished_at = clock_timestamp(), started_at = %(started_at)s,
       result = nullif(d.result, 'null'::jsonb), worker = %(worker)s,
       errors = CASE WHEN d.pending IS NULL THEN j.errors ELSE {schema}.append_errors(j.errors, d.pending) END,
       last_error = coalesce(d.pending -> -1 ->> 'error', j.last_error)
  FROM d
 WHERE j.id = d.id AND j.state = 'queued' AND j.owner IS NULL
   AND NOT EXISTS (SELECT 1 FROM {schema}.job_cancellations c WHERE c.job_id = d.id)
RETURNING j.id),
gone AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd)),
batch AS (DELETE FROM {schema}.job_batches WHERE id = %(batch)s)
SELECT ARRAY(SELECT id FROM upd),
       (SELECT count(pg_notify('skiplock', %(prefix)s || w.job_id)) FROM {schema}.job_waiters w
         WHERE w.job_id IN (SELECT id FROM upd));

-- fragment: complete_write
-- The `done` write of `complete` and `complete_claimed`, up to its guard: errors still pending in
-- job_attempts (an earlier attempt's, see `record_outcome`) are folded in as the row goes; the
-- including statement continues with the row's guard (its WHERE) and then `complete_result`.
WITH p AS MATERIALIZED (SELECT (SELECT pending_errors FROM {schema}.job_attempts WHERE job_id = %(id)s) AS pending),
upd AS (
UPDATE {schema}.jobs
   SET state = 'done', attempts = %(attempt)s, finished_at = clock_timestamp(), started_at = %(started_at)s,
       result = %(result)s::jsonb, worker = %(worker)s, owner = NULL, lease_expires_at = NULL,
       errors = CASE WHEN p.pending IS NULL THEN errors ELSE {schema}.append_errors(errors, p.pending) END,
       last_error = coalesce(p.pending -> -1 ->> 'error', last_error)
  FROM p

-- fragment: complete_result
-- The end of `complete` and `complete_claimed`: (rows written, notifications sent -- only if someone
-- waits for the job).
SELECT count(*),
       (SELECT count(pg_notify('skiplock', %(notice)s)) FROM {schema}.job_waiters w
         WHERE w.job_id IN (SELECT id FROM upd))
  FROM upd;

-- name: complete
-- Transaction lease, inside the job's transaction (which holds its row lock): guarded on the state
-- we claimed it in -- still 'queued', no owner -- and on the absence of a cancellation request (a
-- finishing write never overwrites a cancellation). Returns (rows written, notifications sent).
-- Its own text, not `complete_claimed`'s with a NULL owner: every value here is a key or a column
-- value, so the server keeps one plan for it (it planned the shared text anew at almost every run:
-- a plan made for a NULL owner looked cheaper than the generic one; tests/integration/test_plans_kept.py).
-- include: complete_write
 WHERE id = %(id)s AND state = 'queued' AND owner IS NULL
   AND NOT EXISTS (SELECT 1 FROM {schema}.job_cancellations c WHERE c.job_id = %(id)s)
RETURNING id),
gone AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd))
-- include: complete_result

-- name: complete_claimed
-- `complete` for the claimed lease: fenced on the lease -- still 'running' and still %(owner)s's --
-- instead of a row lock; the flow-control slots this owner held are freed in the same statement
-- (see `claim_flow`), without waiting for one some claim has locked meanwhile.
-- include: complete_write
 WHERE id = %(id)s AND state = 'running' AND owner = %(owner)s::uuid
   AND NOT EXISTS (SELECT 1 FROM {schema}.job_cancellations c WHERE c.job_id = %(id)s)
RETURNING id),
gone AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd)),
freed AS (UPDATE {schema}.flow_slots f SET owner = NULL
           WHERE (f.key, f.n) IN (SELECT key, n FROM {schema}.flow_slots
                                   WHERE owner = %(owner)s::uuid AND EXISTS (SELECT FROM upd)
                                     FOR UPDATE SKIP LOCKED))
-- include: complete_result

-- name: record_outcome
-- Writes what the policy decided when a run did not complete: retry after a delay ('queued'),
-- 'failed', or 'cancelled'; a pending cancellation request turns any of them into 'cancelled'.
-- Normally runs inside the job's own transaction after ROLLBACK TO SAVEPOINT (the handler's effects
-- are gone, the row lock is still ours: SKIP LOCKED never skips our own lock). When the job's
-- connection died it runs in a fresh transaction and never waits: if the row is still locked -- the
-- dead session has not exited yet, or another worker has already claimed the job again (its attempt
-- is counted in job_attempts) -- the row is skipped and the error is appended to the job's
-- job_attempts row instead (`pending_errors`; skipped too if that row is locked), outside any lease.
-- Every finishing write folds pending errors into jobs.errors (before this write's own entry, which
-- is left out if it is already pending) and removes exactly the entries it folded, so they leave
-- job_attempts only when a write recording them commits.
-- Claimed lease (%(owner)s given): fenced on state and owner, and waits for the row (only short
-- statements lock a running row: a heartbeat, the rescuer, a cancellation), so a heartbeat in
-- flight cannot make it look lost.
-- A finished job takes its final attempt count and leaves job_attempts. %(uncount)s (a snooze)
-- gives the attempt back. Claimed lease: the attempt given is the row's count -- the claim counted
-- it in jobs.attempts and the fence makes this write its owner's; a snooze passes one less, so it
-- uses up no attempt in either lease mode. Keeps the last 20 errors; each entry says its attempt,
-- when it ended ('at'), when it started ('started_at': the dashboard shows how long it ran), the
-- error and the worker. Returns the state written, or no row.
WITH req AS (SELECT reason FROM {schema}.job_cancellations WHERE job_id = %(id)s),
dec AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM req) THEN 'cancelled' ELSE %(state)s::text END AS state),
entry AS (SELECT CASE WHEN %(error)s::text IS NOT NULL THEN
                 jsonb_build_array(jsonb_build_object('attempt', %(attempt)s::int, 'at', clock_timestamp(),
                                                      'started_at', %(started_at)s::timestamptz,
                                                      'error', %(error)s::text, 'worker', %(worker)s::text))
                 END AS errors),
pend AS MATERIALIZED (SELECT (SELECT pending_errors FROM {schema}.job_attempts WHERE job_id = %(id)s) AS errors),
-- what this write adds to jobs.errors: the pending entries, then its own (unless already pending)
more AS MATERIALIZED (
SELECT CASE WHEN coalesce(pend.errors @> jsonb_build_array(jsonb_build_object(
                              'attempt', %(attempt)s::int, 'error', %(error)s::text)), false)
            THEN pend.errors ELSE coalesce(pend.errors || entry.errors, pend.errors, entry.errors) END AS errors
  FROM pend, entry),
upd AS (
UPDATE {schema}.jobs j
   SET state = dec.state,
       attempts = CASE WHEN %(owner)s::uuid IS NOT NULL THEN %(attempt)s ELSE greatest(j.attempts, %(attempt)s) END,
       run_at = CASE WHEN dec.state = 'queued' AND %(delay)s::float8 IS NOT NULL
                     THEN clock_timestamp() + %(delay)s::float8 * interval '1 second' ELSE j.run_at END,
       started_at = %(started_at)s,
       finished_at = CASE WHEN dec.state = 'queued' THEN NULL ELSE clock_timestamp() END,
       last_error = coalesce((SELECT 'cancelled: ' || reason FROM req), %(error)s::text,
                             more.errors -> -1 ->> 'error', j.last_error),
       worker = %(worker)s, owner = NULL, lease_expires_at = NULL,
       errors = CASE WHEN more.errors IS NULL THEN j.errors ELSE {schema}.append_errors(j.errors, more.errors) END
  FROM dec, more
 WHERE j.id = coalesce(
         -- transaction lease: ours if we hold its lock, else skipped without waiting
         (SELECT id FROM {schema}.jobs
           WHERE %(owner)s::uuid IS NULL AND id = %(id)s AND state = 'queued' AND owner IS NULL
             FOR UPDATE SKIP LOCKED),
         -- claimed lease: fenced, a rescued job is not ours
         (SELECT id FROM {schema}.jobs
           WHERE %(owner)s::uuid IS NOT NULL AND id = %(id)s AND state = 'running' AND owner = %(owner)s::uuid
             FOR UPDATE))
RETURNING j.id, j.state),
attempts_done AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd WHERE state <> 'queued')),
attempts_kept AS (
UPDATE {schema}.job_attempts a
   SET started = a.started - CASE WHEN %(uncount)s THEN 1 ELSE 0 END,
       -- what was folded above, taken out of the row as it is now (an entry added meanwhile stays)
       pending_errors = (SELECT jsonb_agg(x.e ORDER BY x.n)
                           FROM jsonb_array_elements(a.pending_errors) WITH ORDINALITY AS x(e, n)
                          WHERE NOT coalesce(pend.errors @> jsonb_build_array(x.e), false))
  FROM pend
 WHERE a.job_id IN (SELECT id FROM upd WHERE state = 'queued')
   AND (%(uncount)s OR a.pending_errors IS NOT NULL)),
pending AS (
UPDATE {schema}.job_attempts a
   SET pending_errors = coalesce(a.pending_errors, '[]'::jsonb) || entry.errors
  FROM entry
 WHERE a.job_id = (SELECT job_id FROM {schema}.job_attempts
                    WHERE job_id = %(id)s
                      -- only when the job's row was skipped (still queued, locked by another session)
                      AND %(error)s::text IS NOT NULL AND %(owner)s::uuid IS NULL
                      AND NOT EXISTS (SELECT 1 FROM upd)
                      AND EXISTS (SELECT 1 FROM {schema}.jobs WHERE id = %(id)s AND state = 'queued')
                      FOR UPDATE SKIP LOCKED)),
requests_done AS (DELETE FROM {schema}.job_cancellations WHERE job_id IN (SELECT id FROM upd WHERE state <> 'queued')),
-- claimed lease: the job is no longer running, so the flow-control slots of its owner are free
freed AS (UPDATE {schema}.flow_slots f SET owner = NULL
           WHERE (f.key, f.n) IN (SELECT key, n FROM {schema}.flow_slots
                                   WHERE %(owner)s::uuid IS NOT NULL AND owner = %(owner)s::uuid
                                     AND EXISTS (SELECT FROM upd)
                                     FOR UPDATE SKIP LOCKED))
SELECT upd.state,
       (SELECT count(pg_notify('skiplock', %(notice)s)) FROM {schema}.job_waiters w
         WHERE w.job_id IN (SELECT id FROM upd WHERE state <> 'queued'))
  FROM upd;

-- fragment: flow_hint_of_one
-- The `flow` flag of a new job of queue %(queue)s (migration 17): whether the queue has limits now,
-- the queue's row locked FOR KEY SHARE until the enqueue commits, so the row cannot be deleted
-- (`retire_queue_limit` takes FOR UPDATE) while a job flagged by it is not yet visible (invariant
-- I1 of 0017_flow_hint.sql). A queue without a row locks nothing; a row without limits (retiring)
-- fails the test before the lock. KEY SHARE does not conflict with the updates of `set_queue_limit`.
       EXISTS (SELECT FROM {schema}.queue_limits l
                WHERE l.queue = %(queue)s AND l.limited
                  FOR KEY SHARE)

-- fragment: flow_hint_of_many
-- `flow_hint_of_one` for a batch: %(limit_queues)s is the batch's distinct queue names; the
-- limited ones among them, each row locked as there, once per statement (an InitPlan).
       ARRAY(SELECT l.queue FROM {schema}.queue_limits l
              WHERE l.queue = ANY(%(limit_queues)s::text[])
                AND l.limited
                FOR KEY SHARE)

-- name: enqueue_many
-- One statement for any number of jobs: parallel arrays unnested in order; ids come back in
-- input order. One NOTIFY on the fixed channel `skiplock` wakes idle workers when the inserting
-- transaction commits (a hint only: workers also poll).
-- A job with a sequence is made its sequence's head or 'blocked' by the trigger of migration 15, row
-- by row in input order (see 0015_sequences.sql).
WITH ins AS (
INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at, partition, sequence,
                           sequence_on_failure, flow)
SELECT queue, task, args, priority, max_attempts, coalesce(run_at, now()), partition, sequence, on_failure,
       queue = ANY(
-- include: flow_hint_of_many
       )
  FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(args)b::text[]::jsonb[], %(priorities)b::int[],
              %(max_attempts)b::int[], %(run_ats)s::timestamptz[], %(partitions)b::text[],
              %(sequences)b::text[], %(on_failures)b::text[])
       WITH ORDINALITY AS j(queue, task, args, priority, max_attempts, run_at, partition, sequence, on_failure, n)
 ORDER BY n
RETURNING id),
wake AS (SELECT pg_notify('skiplock', %(wake)s))
SELECT id FROM ins, wake;

-- name: reserve_job_ids
-- Batch enqueue by COPY, step 1 (in the batch's transaction): ids for %(n)s jobs, one nextval each in
-- input order -- ascending, not contiguous, as concurrent enqueuers interleave --, the transaction's
-- now() (the run_at of jobs given none), the one wake-up NOTIFY, delivered at commit, and the batch's
-- queues with limits (%(limit_queues)s: its distinct queues), for the rows' `flow` flag. The sequence
-- is looked up once (MATERIALIZED), not once per row.
WITH seq AS MATERIALIZED (
SELECT pg_get_serial_sequence(format('%%I.jobs', %(schema)s::text), 'id')::regclass AS seq)
SELECT array_agg(nextval(seq.seq)), now(), pg_notify('skiplock', %(wake)s),
-- include: flow_hint_of_many
  FROM seq, generate_series(1, %(n)s::int);

-- name: copy_jobs
-- Step 2: the rows, with the reserved ids (COPY writes given values into the identity column, as
-- OVERRIDING SYSTEM VALUE would); run_at and created_at take their default, the transaction's now().
COPY {schema}.jobs (id, queue, task, args, priority, max_attempts, flow) FROM STDIN;

-- name: copy_jobs_run_at
-- Step 2 when some job has a run_at (the others are sent the transaction's now()).
COPY {schema}.jobs (id, queue, task, args, priority, max_attempts, flow, run_at) FROM STDIN;

-- name: enqueue_one
WITH ins AS (
INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at, partition, sequence,
                           sequence_on_failure, flow)
VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, %(max_attempts)s, coalesce(%(run_at)s, now()),
        %(partition)s, %(sequence)s, %(on_failure)s,
-- include: flow_hint_of_one
       )
RETURNING id),
wake AS (SELECT pg_notify('skiplock', %(wake)s))
SELECT id FROM ins, wake;

-- name: get_job
-- Errors still pending in job_attempts (see `record_outcome`) are shown as recorded. A transaction-lease
-- job in flight (see `running_now`: its row still says 'queued') is shown 'running', with the slot
-- and start of its attempt.
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight WHERE job_id = %(id)s)
SELECT j.id, j.queue, j.task, j.args, j.priority, CASE WHEN f.job_id IS NULL THEN j.state ELSE 'running' END AS state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, coalesce(f.since, j.started_at) AS started_at, j.finished_at,
       coalesce(a.pending_errors -> -1 ->> 'error', j.last_error) AS last_error,
       j.errors || coalesce(a.pending_errors, '[]'::jsonb) AS errors,
       j.result, coalesce(f.slot, j.worker) AS worker, j.unique_key, j.lease_expires_at
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
       LEFT JOIN in_flight f ON f.job_id = j.id
 WHERE j.id = %(id)s;

-- name: list_jobs
-- Newest first, a page at a time by keyset: %(before)s is the last id of the previous page (NULL:
-- the first page), never an OFFSET, so a job enqueued meanwhile (a higher id) cannot push a row into
-- the next page twice, nor a job deleted meanwhile make one skip a row. States as `get_job` shows them:
-- a transaction-lease job in flight is 'running' (and not 'queued').
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight)
SELECT j.id, j.queue, j.task, j.args, j.priority, CASE WHEN f.job_id IS NULL THEN j.state ELSE 'running' END AS state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, coalesce(f.since, j.started_at) AS started_at, j.finished_at,
       coalesce(a.pending_errors -> -1 ->> 'error', j.last_error) AS last_error,
       j.errors || coalesce(a.pending_errors, '[]'::jsonb) AS errors,
       j.result, coalesce(f.slot, j.worker) AS worker, j.unique_key, j.lease_expires_at
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
       LEFT JOIN in_flight f ON f.job_id = j.id
 WHERE (%(state)s::text IS NULL OR j.state = %(state)s OR (%(state)s = 'running' AND f.job_id IS NOT NULL))
   AND (%(state)s::text IS DISTINCT FROM 'queued' OR f.job_id IS NULL)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(before)s::bigint IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: counts
-- Jobs by queue and state, as `get_job` shows them: a transaction-lease job in flight (see
-- `running_now`) counts as 'running', not 'queued'. One snapshot for both parts, so the job counted
-- 'queued' by the first is the one moved by the second.
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight),
c AS (
SELECT queue, state, count(*) AS n FROM {schema}.jobs GROUP BY queue, state
UNION ALL
SELECT j.queue, m.state, m.n
  FROM in_flight f JOIN {schema}.jobs j ON j.id = f.job_id, (VALUES ('queued', -1), ('running', 1)) AS m(state, n))
SELECT queue, state, sum(n)::bigint AS n
  FROM c
 GROUP BY queue, state
HAVING sum(n) > 0
 ORDER BY queue, state;

-- name: terminate_backends
-- Ends the given sessions and waits (up to 5 s) until they are gone, so their locks are released
-- and their transactions rolled back before we write the outcome (used for aborts and timeouts).
SELECT pg_terminate_backend(pid, 5000) FROM unnest(%(pids)s::int[]) AS p(pid);

-- name: savepoint
-- Taken when a handler first reads job.conn (never for one that does not): a failing handler rolls
-- back to here, which undoes its own effects but keeps the row lock, so the outcome is written before
-- anyone can claim the job again.
-- Why only then: a row locked FOR UPDATE by the transaction and then updated inside a subtransaction
-- gets a MultiXact as its xmax (the top transaction's lock plus the subtransaction's update), and a
-- MultiXact updater is never hinted: every later claim that steps over that row version (until vacuum
-- prunes it) looks it up again in the MultiXact SLRU. With many slots that lookup traffic, not the
-- jobs, became the drain's bottleneck (issue 16: 3.4 SLRU reads per job at 16 slots, 18 at 64). So
-- the `done` of a handler that did not touch the database is written in the top transaction, that
-- of one that did after this savepoint is released (`Write.release`), any other outcome
-- after rolling back to it and releasing it: the job's row is only ever updated by the top
-- transaction, which holds its lock (before, 150-240 SLRU reads per writing job at 16 slots;
-- tests/integration/test_no_multixacts.py).
SAVEPOINT skiplock_job;

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT skiplock_job;

-- name: release_savepoint
-- Before the outcome of a job that touched the database is written (after `rollback_to_savepoint` if
-- it is not `done`): its work joins the transaction, its row is written by the top transaction (see
-- `savepoint`), and the next job runs in the top transaction again, not nested in it.
RELEASE SAVEPOINT skiplock_job;

-- name: migrate_lock
-- Serialises concurrent `migrate` runs (per schema) for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('skiplock.migrate:' || %(schema)s, 0));

-- name: record_version
INSERT INTO {schema}.schema_version (version) VALUES (%(version)s);

-- name: set_transaction_timeout
SELECT set_config('transaction_timeout', %(value)s, false);

-- name: backend_pid
-- The server session this statement runs on (behind a pooler, not the pid libpq was told: pooler.py).
SELECT pg_backend_pid();

-- name: default_isolation
SHOW default_transaction_isolation;

-- name: lease_prologue
-- Behind a connection pooler (pooler.py), the first statement of every lease transaction: the
-- lease's bounds for this transaction only (a direct session has them from its start; a transaction
-- pooler may run each transaction on another server session, and a session-level SET would stay
-- with that session for the next client), and the server session it runs on with the transaction's
-- start (now()), which is what pg_stat_activity.xact_start shows: a cancellation or an abort ends
-- exactly this transaction (`end_lease_transaction`). value NULL: no bounds (the watchdog's).
SELECT pg_backend_pid(), now(),
       CASE WHEN %(value)s::text IS NOT NULL
            THEN set_config('idle_in_transaction_session_timeout', %(value)s, true) END,
       CASE WHEN %(value)s::text IS NOT NULL AND current_setting('server_version_num')::int >= 170000
            THEN set_config('transaction_timeout', %(value)s, true) END;

-- name: end_lease_transaction
-- Ends the server session of one lease transaction behind a pooler -- only while it still runs that
-- transaction (same pid, same start): a transaction pooler may since have given the session to
-- another client. Waits up to 5 s until it is gone, as `terminate_backends`.
SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE pid = %(pid)s AND xact_start = %(xact_start)s;

-- name: enqueue_unique
-- At most one queued or running job per unique_key (jobs_unique_key_idx). Returns the new job's id
-- and true, or the existing job's id and false. If the existing job finished between the conflict
-- and the lookup, no row comes back and the caller tries again.
WITH ins AS (
INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at, unique_key, partition, flow)
VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, %(max_attempts)s, coalesce(%(run_at)s, now()),
        %(unique_key)s, %(partition)s,
-- include: flow_hint_of_one
       )
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued', 'running') DO NOTHING
RETURNING id),
wake AS (SELECT pg_notify('skiplock', %(wake)s))
SELECT id, true FROM ins, wake
UNION ALL
SELECT id, false FROM {schema}.jobs
 WHERE unique_key = %(unique_key)s AND state IN ('queued', 'running') AND NOT EXISTS (SELECT 1 FROM ins);

-- name: enqueue_many_unique
-- enqueue_many when some items carry a unique_key (NULL for the others); the caller sends each key
-- at most once. Every item draws its id first, ascending in input order whatever order nextval runs
-- in (an item that conflicts leaves its id unused: a gap). The rows then go in with ON CONFLICT DO
-- NOTHING on jobs_unique_key_idx, as `enqueue_unique` does: a key held by a queued or running job is
-- skipped, after waiting for a concurrent inserter of the same key to commit or roll back. Keyed
-- rows go in sorted by key (byte order), so concurrent batches sharing keys always wait on each other
-- in the same order and never deadlock. Returns one row per item, in input order: (created, id) --
-- the new job's id, or the holder's as this statement's snapshot sees it (a holder that finishes
-- meanwhile is still returned), or NULL when the holder committed after the snapshot was taken (we
-- waited for it): the caller then reads it with `unique_key_holders`. One wake-up NOTIFY, at
-- commit, if anything was inserted.
WITH j AS MATERIALIZED (
SELECT * FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(args)b::text[], %(priorities)b::int[],
                     %(max_attempts)b::int[], %(run_ats)s::timestamptz[], %(unique_keys)b::text[],
                     %(partitions)b::text[])
       WITH ORDINALITY AS j(queue, task, args, priority, max_attempts, run_at, unique_key, partition, n)),
seq AS MATERIALIZED (
SELECT pg_get_serial_sequence(format('%%I.jobs', %(schema)s::text), 'id')::regclass AS seq),
ids AS MATERIALIZED (
SELECT id, row_number() OVER (ORDER BY id) AS n FROM (SELECT nextval(seq.seq) AS id FROM seq, j) drawn),
ins AS (
INSERT INTO {schema}.jobs (id, queue, task, args, priority, max_attempts, run_at, unique_key, partition, flow)
OVERRIDING SYSTEM VALUE
SELECT ids.id, j.queue, j.task, j.args::jsonb, j.priority, j.max_attempts, coalesce(j.run_at, now()), j.unique_key,
       j.partition, j.queue = ANY(
-- include: flow_hint_of_many
       )
  FROM j JOIN ids USING (n)
 ORDER BY j.unique_key COLLATE "C"
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued', 'running') DO NOTHING
RETURNING id),
wake AS (SELECT pg_notify('skiplock', %(wake)s) FROM (SELECT FROM ins LIMIT 1) one)
SELECT ins.id IS NOT NULL,
       coalesce(ins.id, (SELECT h.id FROM {schema}.jobs h
                          WHERE h.unique_key = j.unique_key AND h.state IN ('queued', 'running') LIMIT 1))
  FROM j JOIN ids USING (n)
       LEFT JOIN ins ON ins.id = ids.id
       CROSS JOIN (SELECT count(*) FROM wake) woken
 ORDER BY j.n;

-- name: unique_key_holders
-- The queued or running jobs holding these keys now (jobs_unique_key_idx): run in a statement of its
-- own after `enqueue_many_unique`, so its snapshot sees holders that committed while that one waited.
SELECT unique_key, id FROM {schema}.jobs
 WHERE unique_key = ANY(%(unique_keys)b::text[]) AND state IN ('queued', 'running');

-- name: request_cancel
-- Recorded without waiting on the job's row lock; returns the job's state as committed.
WITH j AS (SELECT id, state FROM {schema}.jobs WHERE id = %(id)s),
ins AS (INSERT INTO {schema}.job_cancellations (job_id, reason)
        SELECT id, %(reason)s FROM j WHERE state IN ('queued', 'running', 'blocked')
        ON CONFLICT (job_id) DO NOTHING)
SELECT state FROM j;

-- name: cancel_if_unlocked
-- Cancels a queued (or blocked: sequences) job nobody holds; skips (returns nothing) if a worker
-- holds its lease. A sequence's head cancelled makes the next job the head (migration 15). Errors
-- still pending in job_attempts (see `record_outcome`) are folded in as the row goes.
WITH p AS MATERIALIZED (SELECT (SELECT pending_errors FROM {schema}.job_attempts WHERE job_id = %(id)s) AS pending),
upd AS (
UPDATE {schema}.jobs
   SET state = 'cancelled', finished_at = clock_timestamp(),
       last_error = 'cancelled: ' || coalesce((SELECT reason FROM {schema}.job_cancellations
                                                WHERE job_id = %(id)s), ''),
       errors = CASE WHEN p.pending IS NULL THEN errors ELSE {schema}.append_errors(errors, p.pending) END
  FROM p
 WHERE id = (SELECT id FROM {schema}.jobs WHERE id = %(id)s AND state IN ('queued', 'blocked') FOR UPDATE SKIP LOCKED)
RETURNING id),
requests_done AS (DELETE FROM {schema}.job_cancellations WHERE job_id IN (SELECT id FROM upd)),
attempts_done AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd))
SELECT id, (SELECT count(pg_notify('skiplock', %(notice)s)) FROM {schema}.job_waiters w
             WHERE w.job_id IN (SELECT id FROM upd))
  FROM upd;

-- name: end_lease_holder
-- Ends the session holding a job's transaction lease (its transaction rolls back). The backend pid
-- is the one recorded when the current attempt started, and only counts if that session's
-- transaction began before the attempt did (so a reused pid is never hit).
-- A job running in a batch is found through its batch's row: ending that session rolls back the
-- whole batch (its other jobs run again, each alone: see `start_batch`).
SELECT pg_terminate_backend(s.pid)
  FROM (SELECT a.backend_pid, a.started_at FROM {schema}.job_attempts a WHERE a.job_id = %(id)s
        UNION ALL
        SELECT b.backend_pid, b.started_at FROM {schema}.job_batches b WHERE b.ids @> ARRAY[%(id)s::bigint]) a
  JOIN pg_stat_activity s ON s.pid = a.backend_pid
 WHERE s.xact_start <= a.started_at AND s.application_name LIKE 'skiplock-worker%%';

-- name: cancel_failed_head
-- A failed job that still holds its sequence (the rule 'wait', migration 15) cancelled by an operator:
-- the sequence goes on (its next job becomes the head, in the same statement, by the trigger).
-- Any other job: no row.
UPDATE {schema}.jobs j
   SET state = 'cancelled', last_error = 'cancelled: ' || %(reason)s
 WHERE j.id = %(id)s AND j.state = 'failed' AND j.sequence IS NOT NULL
   AND EXISTS (SELECT FROM {schema}.job_sequences s WHERE s.key = j.sequence AND s.head = j.id)
RETURNING j.id;

-- name: forget_cancel_request
DELETE FROM {schema}.job_cancellations WHERE job_id = %(id)s;

-- name: retry_job
-- Puts a failed (or cancelled) job back: a fresh set of attempts, its error history kept. Not if a
-- queued or running job holds its unique_key (jobs_unique_key_idx allows one): no row then, and the
-- caller says why. (A holder committed after this statement's snapshot makes the UPDATE fail on the
-- index instead: the caller treats that the same way.)
WITH upd AS (
UPDATE {schema}.jobs j
   SET state = 'queued', attempts = 0, run_at = now(), finished_at = NULL, started_at = NULL, result = NULL,
       -- the flag as an enqueue sets it (`flow_hint_of_one`), for its queue now
       flow = EXISTS (SELECT FROM {schema}.queue_limits l
                       WHERE l.queue = j.queue AND l.limited
                         FOR KEY SHARE)
 WHERE j.id = %(id)s AND j.state IN ('failed', 'cancelled')
   AND (j.unique_key IS NULL OR NOT EXISTS (SELECT 1 FROM {schema}.jobs h WHERE h.unique_key = j.unique_key
                                                AND h.state IN ('queued', 'running')))
RETURNING j.id),
a AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd)),
c AS (DELETE FROM {schema}.job_cancellations WHERE job_id IN (SELECT id FROM upd))
SELECT id FROM upd;

-- name: unique_key_holder
-- The queued or running job holding a unique_key now, if any (at most one: jobs_unique_key_idx).
SELECT id, state FROM {schema}.jobs WHERE unique_key = %(unique_key)s AND state IN ('queued', 'running');

-- name: retry_failed
-- Puts every failed job (of a queue) back, as retry_job does, except those whose unique_key is
-- taken: by a queued or running job, or by an earlier failed job with the same key that this
-- statement retries (jobs_unique_key_idx allows one queued job per key; the lowest id wins, as if
-- the jobs were retried one by one in id order). One row per failed job, in id order: (id,
-- unique_key, retried, the id of the job holding its key if it was not retried). A holder committed
-- after the snapshot makes the UPDATE fail on the index, undoing the whole statement: the caller
-- runs it again (its new snapshot sees the holder).
WITH failed AS (
SELECT j.id, j.unique_key,
       (SELECT h.id FROM {schema}.jobs h WHERE h.unique_key = j.unique_key AND h.state IN ('queued', 'running')
         LIMIT 1) AS holder,
       min(j.id) OVER (PARTITION BY j.unique_key) AS first_with_key
  FROM {schema}.jobs j
 WHERE j.state = 'failed' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)),
upd AS (
UPDATE {schema}.jobs j
   SET state = 'queued', attempts = 0, run_at = now(), finished_at = NULL, started_at = NULL, result = NULL,
       -- the flag as an enqueue sets it (`flow_hint_of_one`), for its queue now
       flow = EXISTS (SELECT FROM {schema}.queue_limits l
                       WHERE l.queue = j.queue AND l.limited
                         FOR KEY SHARE)
  FROM failed f
 WHERE j.id = f.id AND j.state = 'failed' AND f.holder IS NULL
   AND (f.unique_key IS NULL OR f.first_with_key = f.id)
RETURNING j.id),
a AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM upd))
SELECT f.id, f.unique_key, f.id IN (SELECT id FROM upd) AS retried,
       coalesce(f.holder, CASE WHEN f.unique_key IS NOT NULL AND f.first_with_key <> f.id THEN f.first_with_key END)
  FROM failed f
 ORDER BY f.id;

-- name: queue_known
SELECT EXISTS (SELECT 1 FROM {schema}.jobs WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s);

-- name: pause_queue
INSERT INTO {schema}.paused_queues (queue) VALUES (%(queue)s) ON CONFLICT (queue) DO NOTHING;

-- name: resume_queue
DELETE FROM {schema}.paused_queues WHERE queue = %(queue)s RETURNING queue;

-- name: paused_queues
SELECT queue FROM {schema}.paused_queues ORDER BY queue;

-- name: claimable_queues
-- For a worker of every queue (worker/queue_view.py): the paused queues, and -- only when there are
-- any -- the queues with queued jobs, paused ones included, in name order: a loose index scan of
-- jobs_claim_idx (its leading column is the queue), one descent per queue, whatever their backlogs;
-- at most %(most)s + 1 names (more than %(most)s: the caller claims every queue as before).
WITH RECURSIVE paused AS MATERIALIZED (SELECT queue FROM {schema}.paused_queues),
queued(queue, n) AS (
  SELECT (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued'), 1
   WHERE EXISTS (SELECT FROM paused)
  UNION ALL
  SELECT (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued' AND j.queue > q.queue), q.n + 1
    FROM queued q WHERE q.queue IS NOT NULL AND q.n <= %(most)s)
SELECT ARRAY(SELECT queue FROM paused ORDER BY queue),
       ARRAY(SELECT queue FROM queued WHERE queue IS NOT NULL ORDER BY queue);

-- name: add_waiter
INSERT INTO {schema}.job_waiters (job_id) VALUES (%(id)s) ON CONFLICT (job_id) DO NOTHING;

-- name: remove_waiter
DELETE FROM {schema}.job_waiters WHERE job_id = %(id)s;

-- name: listen
LISTEN skiplock;

-- name: prune
-- One small batch of finished jobs of one state older than the cutoff. SKIP LOCKED and a small
-- LIMIT keep it from ever blocking the queue; `state` is a finished state (the caller checks), so a
-- queued or running job is never deleted. Each deleted row is a dead tuple until vacuum: `skiplock
-- prune` loops until a batch comes back short; the background pruner deletes at most half the
-- table's vacuum threshold per pass (maintenance/pruner.py).
-- The cutoff is the transaction's start (now(), stable: each call is a transaction of its own), so
-- it bounds the walk of jobs_finished_idx as an index condition. With clock_timestamp() (volatile)
-- it was a filter: every pass that found fewer than %(batch)s jobs due -- the last one of each pass,
-- and every pass of a state with nothing due -- read every finished job still within its retention
-- (a day of done jobs by default), row by row.
WITH victims AS (
SELECT id FROM {schema}.jobs
 WHERE state = %(state)s AND finished_at < now() - %(age)s::float8 * interval '1 second'
   -- a failed job holding its sequence (rule 'wait', migration 15) stays until retried or cancelled
   AND (sequence IS NULL OR NOT EXISTS (SELECT FROM {schema}.job_sequences s
                                         WHERE s.key = jobs.sequence AND s.head = jobs.id))
 ORDER BY finished_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED),
d AS (DELETE FROM {schema}.jobs WHERE id IN (SELECT id FROM victims) RETURNING id),
w AS (DELETE FROM {schema}.job_waiters WHERE job_id IN (SELECT id FROM d))
SELECT count(*) FROM d;

-- name: jobs_vacuum_threshold
-- The dead tuples at which autovacuum vacuums the jobs table, by the server's formula: threshold +
-- scale_factor x reltuples, capped by autovacuum_vacuum_max_threshold (PostgreSQL 18+; -1: no cap),
-- each from the table's storage parameters where it sets them (migration 0001: 2,000, scale 0), else
-- from the server's settings. The background pruner sizes its passes by it.
WITH t AS (
SELECT greatest(c.reltuples, 0)::float8 AS reltuples,
       (SELECT option_value FROM pg_options_to_table(c.reloptions)
         WHERE option_name = 'autovacuum_vacuum_threshold') AS base,
       (SELECT option_value FROM pg_options_to_table(c.reloptions)
         WHERE option_name = 'autovacuum_vacuum_scale_factor') AS scale,
       (SELECT option_value FROM pg_options_to_table(c.reloptions)
         WHERE option_name = 'autovacuum_vacuum_max_threshold') AS cap
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = 'jobs'),
f AS (
SELECT coalesce(base, current_setting('autovacuum_vacuum_threshold'))::float8
         + coalesce(scale, current_setting('autovacuum_vacuum_scale_factor'))::float8 * reltuples AS threshold,
       coalesce(cap, current_setting('autovacuum_vacuum_max_threshold', true), '-1')::float8 AS cap
  FROM t)
SELECT CASE WHEN cap >= 0 THEN least(threshold, cap) ELSE threshold END FROM f;

-- name: prune_ticks
DELETE FROM {schema}.periodic_ticks WHERE tick < clock_timestamp() - %(age)s::float8 * interval '1 second';

-- name: prune_batches
-- Rows of batches that never committed, once none of their jobs is queued any more (a live batch's
-- jobs are all queued until its COMMIT, which deletes its row).
DELETE FROM {schema}.job_batches b
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.id = ANY(b.ids) AND j.state = 'queued');

-- name: try_maintenance_lock
-- One maintenance pass at a time (per schema), for the rest of the transaction; never waits.
SELECT pg_try_advisory_xact_lock(hashtextextended('skiplock.maintenance:' || %(schema)s, 0));

-- name: insert_tick
-- Whoever inserts the (schedule, tick) row enqueues that tick's job, in the same transaction.
INSERT INTO {schema}.periodic_ticks (schedule, tick) VALUES (%(schedule)s, %(tick)s)
ON CONFLICT (schedule, tick) DO NOTHING
RETURNING tick;

-- name: set_tick_job
UPDATE {schema}.periodic_ticks SET job_id = %(job_id)s WHERE schedule = %(schedule)s AND tick = %(tick)s;

-- name: last_tick
SELECT max(tick) FROM {schema}.periodic_ticks WHERE schedule = %(schedule)s;

-- name: set_local_timeouts
-- A task's timeout, for this transaction only: a statement running past it is cancelled (the session
-- lives on: the worker records the timeout), and the session of a handler idle (stuck outside the
-- database) past it plus a margin (%(session)s) is ended, so the server returns the job to the queue
-- even if the worker process itself is stuck. The margin lets the worker's own timer, started a
-- moment later, record the timeout first; at the same deadline the server's won the race often (the
-- attempt then looked unfinished, and ran again uncharged).
SELECT set_config('statement_timeout', %(value)s, true),
       set_config('idle_in_transaction_session_timeout', %(session)s, true);

-- name: stop_local_transaction_timeout
-- PostgreSQL 17+: a transaction_timeout changed inside a transaction re-arms its timer only if the
-- timer was off -- the lease's own (session-level transaction_timeout = lease_timeout) is already
-- running, so setting the task's value alone would change nothing, and idle_in_transaction_session_timeout
-- is not armed either when it is not below transaction_timeout. Turned off first, then
-- `set_local_transaction_timeout` arms it anew: the task's timeout counts from now.
SELECT set_config('transaction_timeout', '0', true);

-- name: set_local_transaction_timeout
SELECT set_config('transaction_timeout', %(value)s, true);

-- name: start_claimed
-- Claimed lease: inside the claim transaction, move the row to 'running' with our owner token and a
-- lease, counting the attempt; the caller commits at once, so the attempt is durable before the
-- handler starts. Returns the attempt number and any pending cancellation request.
UPDATE {schema}.jobs
   SET state = 'running', owner = %(owner)s, attempts = attempts + 1, worker = %(worker)s,
       started_at = now(), lease_expires_at = now() + %(lease)s::float8 * interval '1 second'
 WHERE id = %(id)s AND state = 'queued'
RETURNING attempts, (SELECT reason FROM {schema}.job_cancellations WHERE job_id = %(id)s);

-- name: heartbeat
-- Extends the leases this worker still owns; returns their ids (a missing id is a lost lease).
UPDATE {schema}.jobs j
   SET lease_expires_at = now() + h.lease * interval '1 second'
  FROM unnest(%(ids)s::bigint[], %(owners)s::uuid[], %(leases)s::float8[]) AS h(id, owner, lease)
 WHERE j.id = h.id AND j.state = 'running' AND j.owner = h.owner
RETURNING j.id;

-- name: rescue_expired
-- Leases nobody renewed: back to the queue, or 'failed' after the last attempt. A batch at a time,
-- skipping rows someone is finishing right now. A job failed here is finished: its waiters are
-- notified, as by every finishing write.
WITH expired AS (
SELECT id, owner FROM {schema}.jobs
 WHERE state = 'running' AND lease_expires_at < now()
 ORDER BY lease_expires_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED),
upd AS (
UPDATE {schema}.jobs j
   SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
       finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
       run_at = now(), owner = NULL, lease_expires_at = NULL,
       last_error = format('lease expired: worker %%s stopped renewing its lease during attempt %%s',
                           j.worker, j.attempts),
       errors = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
                   FROM (SELECT e, n FROM jsonb_array_elements(j.errors || jsonb_build_array(
                             jsonb_build_object('attempt', j.attempts, 'at', clock_timestamp(),
                                                'error', 'lease expired', 'worker', j.worker)))
                                   WITH ORDINALITY AS x(e, n)
                          ORDER BY n DESC LIMIT 20) last)
  FROM expired
 WHERE j.id = expired.id
RETURNING j.id, j.state),
woken AS (SELECT count(pg_notify('skiplock', %(prefix)s || w.job_id)) FROM {schema}.job_waiters w
           WHERE w.job_id IN (SELECT id FROM upd WHERE state = 'failed')),
-- the flow-control slots the rescued leases held (see `claim_flow`): free again
freed AS (UPDATE {schema}.flow_slots f SET owner = NULL
           WHERE (f.key, f.n) IN (SELECT key, n FROM {schema}.flow_slots
                                   WHERE owner IN (SELECT e.owner FROM expired e JOIN upd ON upd.id = e.id)
                                     FOR UPDATE SKIP LOCKED))
SELECT id, state FROM upd, woken ORDER BY id;

-- name: cancel_running
-- A claimed-lease job: cancelled directly; the worker's fenced finishing write will be refused. A
-- finishing write: its waiters are notified.
WITH was AS MATERIALIZED (SELECT owner FROM {schema}.jobs WHERE id = %(id)s AND state = 'running'),
upd AS (
UPDATE {schema}.jobs
   SET state = 'cancelled', finished_at = clock_timestamp(), owner = NULL, lease_expires_at = NULL,
       last_error = 'cancelled: ' || coalesce((SELECT reason FROM {schema}.job_cancellations WHERE job_id = %(id)s), '')
 WHERE id = %(id)s AND state = 'running'
RETURNING id),
requests_done AS (DELETE FROM {schema}.job_cancellations WHERE job_id IN (SELECT id FROM upd)),
-- the flow-control slots its owner held (see `claim_flow`): free again
freed AS (UPDATE {schema}.flow_slots f SET owner = NULL
           WHERE (f.key, f.n) IN (SELECT key, n FROM {schema}.flow_slots
                                   WHERE owner = (SELECT owner FROM was) AND EXISTS (SELECT FROM upd)
                                     FOR UPDATE SKIP LOCKED))
SELECT id, (SELECT count(pg_notify('skiplock', %(notice)s)) FROM {schema}.job_waiters w
             WHERE w.job_id IN (SELECT id FROM upd))
  FROM upd;

-- ==== flow control (docs/flow-control.md; migration 13; Python in leasing.py / worker/flow.py) =====
-- A job is flow-controlled when its task has limits in the worker's code (%(lt_*)s: parallel arrays
-- of task, concurrency, partition_by, seconds between starts) or its queue has a row in
-- queue_limits. Such jobs are claimed only by `claim_flow` (the plain claims pass only unlimited
-- tasks and skip limited queues), one at a time. A job's keys, each a JSON array text (no separator
-- can make two keys equal): ["task", task] -- or ["task", task, partition] when the job has an
-- explicit partition or its task a `partition_by` (then the argument's text, '' if absent) -- and
-- ["queue", queue]. Each key with a concurrency limit N has the slots (key, 1..N) in flow_slots;
-- each with a rate has a row in flow_rates.
--
-- Invariants:
-- * a flow-controlled job runs only while its lease holds one slot numbered <= N of each of its
--   concurrency keys, so at most N of them run at once, whatever the workers and lease modes.
--   Transaction lease: the slot's row lock, taken by `claim_flow` in the job's lease transaction,
--   lasts exactly as long as the job's lease (released by the same COMMIT or rollback, by a killed
--   session too). Claimed lease: `own_slots` writes the job's owner into its slots in the claim
--   transaction (one commit with the job's 'running' row); every path out of 'running' (complete_claimed,
--   record_outcome, rescue_expired, cancel_running) clears that owner's slots in the same statement,
--   without waiting: a slot row some claim has locked meanwhile (a claim that found it owned only on
--   re-checking its newest version keeps that lock until its own transaction ends) is skipped, and
--   `release_stale_slots` (the rescuer's pass) clears it once unlocked. A slot is free when it is
--   neither locked nor owned; `owner IS NULL` is re-checked on the row's newest version when it is
--   locked (READ COMMITTED re-evaluation), so two claims never both take one slot.
-- * held back is not failed: a claim that cannot get every slot (or, after it, every rate start)
--   rolls its transaction back before any attempt is counted -- the job is untouched.
-- * no waiting: every lock here is SKIP LOCKED, except the rate rows (`take_starts`), locked only
--   by short autocommit statements, in key order.

-- fragment: flow_limits
-- The limits a flow claim applies, as its first CTEs: `lt`, the worker's task limits (%(lt_*)s:
-- parallel arrays of task, concurrency, partition_by, seconds between starts), and `ql`, the queue
-- limits. A statement including it continues with its next CTE (`j`, the jobs it locks).
WITH lt AS MATERIALIZED (
SELECT * FROM unnest(%(lt_tasks)s::text[], %(lt_concurrency)s::int[], %(lt_partition_by)s::text[],
                     %(lt_every)s::float8[]) AS lt(task, concurrency, partition_by, every)),
ql AS MATERIALIZED (
SELECT queue, concurrency, rate_period / rate_count AS every FROM {schema}.queue_limits),

-- fragment: flow_job_keys
-- A flow claim's `k` (after its `j`, the jobs locked): each job with its two keys -- ["task", task], or
-- ["task", task, partition] when the job has an explicit partition or its task a `partition_by`
-- (then the argument's text, '' if absent), and ["queue", queue] -- each with its concurrency limit
-- and its seconds between starts (both NULL: that key is not limited; the caller drops it), then the
-- job's partition. Computed on the claim's few rows only (after LIMIT), never per job walked. The
-- including statement may add columns of its `j` (`, j.step`), then includes `flow_slots_taken`,
-- which ends `k`.
, k AS MATERIALIZED (
SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at,
       CASE WHEN j.partition IS NULL AND lt.partition_by IS NULL THEN jsonb_build_array('task', j.task)
            ELSE jsonb_build_array('task', j.task, coalesce(j.partition, j.args ->> lt.partition_by, '')) END::text
         AS task_key,
       lt.concurrency AS task_limit, lt.every AS task_every,
       jsonb_build_array('queue', j.queue)::text AS queue_key, ql.concurrency AS queue_limit, ql.every AS queue_every,
       j.partition

-- fragment: flow_slots_taken
-- A flow claim's final part: the end of its `k` (the jobs joined to their limits), then ONE free slot row of each limited key of the claim (each
-- key once, however many of its jobs have it; its limit the largest the claim's rows give it),
-- locked FOR UPDATE SKIP LOCKED with `owner IS NULL` re-checked on the row's newest version (READ
-- COMMITTED re-evaluation), so two transactions never both take one slot and the lock lasts exactly
-- as long as the lease transaction. A batch shares its slot of a key among its jobs of that key: it
-- runs them one after another, never two at once (see `claim_flow`). Each row of `k` gets, for its
-- task key and its queue key, the slot taken (NULL: none free, or the key not limited) and, when none
-- was free, how many of the key's slots numbered <= the limit exist (fewer: the caller creates them
-- with `ensure_slots`, and that key's jobs wait for its next claim; a limit raised at runtime thus
-- gets its new slots once the old ones are all taken). In the claim's own statement (it was the caller's
-- next statement, `take_slots`, a round trip more per claim); the slot rows are read on the
-- claim's snapshot, and a slot freed since is only found by the next claim (it errs towards
-- holding back, never towards running over a limit: the lock's re-check is on the newest version).
-- A key that is not limited is not in `s`: its slot and count come back NULL.
  FROM j LEFT JOIN lt ON lt.task = j.task LEFT JOIN ql ON ql.queue = j.queue)
, w AS (
SELECT x.key, max(x.lim) AS lim
  FROM (SELECT task_key, task_limit FROM k WHERE task_limit IS NOT NULL
        UNION ALL
        SELECT queue_key, queue_limit FROM k WHERE queue_limit IS NOT NULL) AS x(key, lim)
 GROUP BY x.key),
s AS MATERIALIZED (
SELECT w.key, g.n,
       CASE WHEN g.n IS NULL  -- counted only when none was free: were some missing, the caller creates them
            THEN (SELECT count(*) FROM {schema}.flow_slots e WHERE e.key = w.key AND e.n <= w.lim)
            ELSE w.lim END AS have  -- (a slot taken: more are created once they are all taken)
  FROM w LEFT JOIN LATERAL (
       SELECT f.n FROM {schema}.flow_slots f
        WHERE f.key = w.key AND f.n <= w.lim AND f.owner IS NULL
        ORDER BY f.n LIMIT 1
          FOR UPDATE SKIP LOCKED) g ON true)
SELECT k.*, ts.n, ts.have, qs.n, qs.have
  FROM k LEFT JOIN s ts ON ts.key = k.task_key LEFT JOIN s qs ON qs.key = k.queue_key

-- fragment: claim_flow_rows
-- `claim_flow`'s rows (and `claim_flow_of_queue`'s), before the test of their queue.
SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
       now() AS claimed_at, j.partition
  FROM {schema}.jobs j
 WHERE j.state = 'queued' AND j.run_at <= now() AND j.task = ANY(%(tasks)s::text[])

-- fragment: claim_flow_filters
-- `claim_flow`'s filters after the test of the queue (and `claim_flow_of_queue`'s).
   -- the keys held back, each test behind an emptiness test run once per claim: `queue <> ALL($n)`
   -- alone is estimated at ~0 rows when one value fills the column (one queue, one task), and the
   -- generic plan then became a seq scan and a sort, so every claim was planned anew (0.4-0.6 ms)
   AND (NOT EXISTS (SELECT FROM unnest(%(held_queues)s::text[])) OR j.queue <> ALL(%(held_queues)s::text[]))
   AND (NOT EXISTS (SELECT FROM unnest(%(held_tasks)s::text[])) OR j.task <> ALL(%(held_tasks)s::text[]))
   AND (j.task = ANY(%(lt_tasks)s::text[]) OR j.queue = ANY(ARRAY(SELECT queue FROM ql)))
   -- paused queues, as the plain claims test them (once per claim, not a join per row)
   AND (NOT EXISTS (SELECT FROM {schema}.paused_queues)
        OR j.queue <> ALL (ARRAY(SELECT queue FROM {schema}.paused_queues)))
   AND (cardinality(%(held)s::text[]) = 0
        OR jsonb_build_array('task', j.task, coalesce(j.partition,
             j.args ->> (SELECT lt.partition_by FROM lt WHERE lt.task = j.task), ''))::text <> ALL(%(held)s::text[]))

-- name: claim_flow
-- Lock up to %(limit)s available flow-controlled jobs (priority, run_at, id) of %(queues)s (NULL: every queue)
-- and %(tasks)s without the `flow` flag (a limited queue's jobs: `claim_flow_of_queue`), skipping the
-- keys the caller found full or held back this round (%(held_queues)s, %(held_tasks)s: whole queues
-- and unpartitioned tasks, filtered on the index entry; %(held)s: other keys, checked per row). Returns one row per job locked: the job with its keys, their limits and
-- rates (`flow_job_keys`), and the slots the same statement took: one free slot of each limited key
-- of the claim (`flow_slots_taken`), before the caller runs any job.
-- A batch (%(limit)s > 1; the worker's batching policy decides, as for the plain claim):
-- * a batch's jobs run one after another in its transaction (worker/executor.py, `_run_many`), never
--   two at once, so a batch needs ONE slot of each key its jobs have, whatever number of its jobs
--   have that key: each key with a limit gets one slot row numbered <= the limit, locked by
--   `flow_slots_taken` (FOR UPDATE SKIP LOCKED; the owner re-checked on the newest version), shared by
--   every job of the batch with that key. A batch of 32 jobs of one queue limited to 50 takes one of its 50 slots,
--   not 32 (measured: per-job slots let two such batches fill the limit).
-- * the caller runs only the jobs that got a slot of every key (and, with a rate, only a first such
--   job, alone, after `take_starts`); the others -- and the slots they got of their other keys --
--   stay locked, untouched, until the batch's transaction ends (COMMIT releases them, as it does a
--   batch's jobs not started), which can only hold jobs back, never let one run over a limit.
-- * the invariant is on slots: per key, jobs running <= slots held by lease transactions (or owned)
--   <= N, as a lease transaction runs at most one job at a time. A batch holds its slots from its
--   claim to its COMMIT or rollback, also while none of its jobs of that key is running (a job
--   waiting its turn, one the batch will not start: its time budget ran out, the worker is
--   stopping) -- fast jobs only (batch_budget; a job not measured fast, a timed or claimed-lease
--   one is claimed alone).
-- include: flow_limits
j AS MATERIALIZED (
-- include: claim_flow_rows
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
   AND NOT j.flow  -- jobs_claim_any_idx (migration 17): the flagged jobs are those of limited queues,
                   -- claimed one queue at a time by `claim_flow_of_queue` (worker/flow.py)
-- include: claim_flow_filters
 ORDER BY j.priority, j.run_at, j.id
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED)
-- include: flow_job_keys
-- include: flow_slots_taken
;
  -- (the caller puts the rows in (priority, run_at, id) order: no sort over the claim here)

-- name: claim_flow_of_queue
-- `claim_flow` for a worker of one queue (%(queue)s), the same but for the queue's test: an equality,
-- so the plan the server keeps for it (it runs under its generic plan, `generic_plan_for_claim`) is
-- the walk of jobs_claim_idx from the queue's first entry, whatever the name. `claim_flow`'s
-- `%(queues)s IS NULL OR queue = ANY(%(queues)s)` is a filter in its generic plan (a walk of
-- jobs_claim_any_idx over every queue's jobs), so a worker given its queues plans `claim_flow` anew
-- at each run (its custom plans pick jobs_claim_idx); one of one queue no longer does.
-- include: flow_limits
j AS MATERIALIZED (
-- include: claim_flow_rows
   AND j.queue = %(queue)s
-- include: claim_flow_filters
 ORDER BY j.priority, j.run_at, j.id
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED)
-- include: flow_job_keys
-- include: flow_slots_taken
;

-- name: claim_flow_fair
-- `claim_flow` for one fair queue (queue_limits.fair), round-robin across its partitions: the first
-- available job, in (priority, run_at, id) order, of the first partition after %(after)s (the partition
-- this worker process claimed from last; NULL: from the first) -- one descent of jobs_fair_idx
-- per claim, whatever the number of partitions or of their waiting jobs (a partition whose jobs are
-- all locked is stepped over on the index). The caller wraps round (NULL) when nothing comes after,
-- so a lone partition still gets every claim (work-conserving), and falls back to `claim_flow` for
-- the queue's jobs with no partition. Priorities hold within a partition, not across them. The result
-- is `claim_flow`'s, and so are the slots (`flow_slots_taken`).
-- include: flow_limits
j AS MATERIALIZED (
SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
       now() AS claimed_at, j.partition
  FROM {schema}.jobs j
 WHERE j.state = 'queued' AND j.queue = %(queue)s AND j.partition IS NOT NULL
   -- the cursor, as an index condition in every plan ('' when NULL: enqueue stores no empty partition,
   -- and '' sorts before every other text); `(after IS NULL OR partition > after)` was a filter in the
   -- generic plan, which then walked every partition before the cursor, backlogs and all
   AND j.partition > coalesce(%(after)s::text, '')
   AND j.run_at <= now() AND j.task = ANY(%(tasks)s::text[])
   AND (NOT EXISTS (SELECT FROM unnest(%(held_tasks)s::text[])) OR j.task <> ALL(%(held_tasks)s::text[]))
   AND NOT EXISTS (SELECT FROM {schema}.paused_queues p WHERE p.queue = %(queue)s)
   AND (cardinality(%(held)s::text[]) = 0
        OR jsonb_build_array('task', j.task, coalesce(j.partition,
             j.args ->> (SELECT lt.partition_by FROM lt WHERE lt.task = j.task), ''))::text <> ALL(%(held)s::text[]))
 ORDER BY j.partition, j.priority, j.run_at, j.id
 LIMIT 1
   FOR UPDATE OF j SKIP LOCKED)
-- include: flow_job_keys
-- include: flow_slots_taken
;


-- name: claim_flow_fair_many
-- `claim_flow_fair` for a batch (%(limit)s > 1; a fair queue without weights): the first available
-- job of each of the next %(limit)s partitions after %(after)s, one job per partition, so a batch
-- goes once round them as that many single claims would. `walk` takes them one partition at a time,
-- each step ONE descent of jobs_fair_idx: the first job, in (partition, priority, run_at, id) order,
-- of a partition after the previous step's, locked as it is found (FOR UPDATE SKIP LOCKED,
-- re-checked on the row's newest version), whatever the partitions' backlogs. A job another
-- transaction holds is stepped over on the index like any locked row: a partition whose first job
-- another worker's batch holds still gets its next one (were it left out, a batch taken while
-- another slot's batch holds every partition's first job would come back empty, and the worker
-- would fall back to `claim_flow`, which takes the biggest backlog's jobs in id order -- measured: 40
-- of a big partition's jobs out of turn in tests/flow/test_flow_fair.py; the steps cost at most the
-- jobs held in flight, not the backlog), and a partition with no available job gets none and is not
-- waited for (the step goes on to the next partition's).
-- Slots are taken as by `claim_flow` (`flow_slots_taken`: one slot row per key, shared by the batch's
-- jobs of that key), with the same invariants; the caller moves its cursor past the last partition
-- returned and wraps round when none come after.
-- Each row says its place in the walk (`step`): the partitions' order in the index, i.e. their
-- collation's, which the caller's cursor must follow (a batch runs its jobs in that order too).
-- include: flow_limits
j AS MATERIALIZED (
WITH RECURSIVE walk(step, id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, claimed_at,
                    partition) AS (
SELECT 1, f.*
  FROM (SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
               now() AS claimed_at, j.partition
          FROM {schema}.jobs j
         WHERE j.state = 'queued' AND j.queue = %(queue)s AND j.partition IS NOT NULL
           AND j.partition > coalesce(%(after)s::text, '')  -- as in `claim_flow_fair`
           AND j.run_at <= now() AND j.task = ANY(%(tasks)s::text[])
           AND (NOT EXISTS (SELECT FROM unnest(%(held_tasks)s::text[])) OR j.task <> ALL(%(held_tasks)s::text[]))
           AND (cardinality(%(held)s::text[]) = 0
                OR jsonb_build_array('task', j.task, j.partition)::text <> ALL(%(held)s::text[]))
           AND NOT EXISTS (SELECT FROM {schema}.paused_queues p WHERE p.queue = %(queue)s)
         ORDER BY j.partition, j.priority, j.run_at, j.id
         LIMIT 1
           FOR UPDATE OF j SKIP LOCKED) f
UNION ALL
SELECT w.step + 1, f.*
  FROM walk w,
       LATERAL (SELECT j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.max_attempts, j.run_at,
                       j.created_at, now() AS claimed_at, j.partition
                  FROM {schema}.jobs j
                 WHERE j.state = 'queued' AND j.queue = %(queue)s AND j.partition IS NOT NULL
                   AND j.partition > w.partition
                   AND j.run_at <= now() AND j.task = ANY(%(tasks)s::text[])
                   AND (NOT EXISTS (SELECT FROM unnest(%(held_tasks)s::text[])) OR j.task <> ALL(%(held_tasks)s::text[]))
                   AND (cardinality(%(held)s::text[]) = 0
                        OR jsonb_build_array('task', j.task, j.partition)::text <> ALL(%(held)s::text[]))
                   AND NOT EXISTS (SELECT FROM {schema}.paused_queues p WHERE p.queue = %(queue)s)
                 ORDER BY j.partition, j.priority, j.run_at, j.id
                 LIMIT 1
                   FOR UPDATE OF j SKIP LOCKED) f
 WHERE w.step < %(limit)s)
SELECT id, queue, task, args, priority, attempts, max_attempts, run_at, created_at, claimed_at, partition, step
  FROM walk)
-- include: flow_job_keys
     , j.step
-- include: flow_slots_taken
;
  -- (the caller puts the rows in walk order, `step`: no sort over the claim here)

-- name: generic_plan_for_claim
-- Sent with a fair queue's claims and with `claim_flow` over every queue, in their round trip
-- (pipeline), and undone right after them by `plan_cache_mode_back`: they run under their generic
-- plan, which the server keeps -- the walk of jobs_claim_any_idx in (priority, run_at, id) order, or the
-- descents of jobs_fair_idx, whatever the values (tests/flow/test_flow_plans.py). Left to itself the
-- server planned them anew at every run (0.4-1.9 ms of server CPU per claim, more than running
-- it): the generic plan's estimate charges filters that a plan made for the values drops (no key
-- held back: `cardinality(held) = 0` is true), so it looked costlier than a custom one. Also sent
-- with `claim_flow_of_queue` (a worker of one queue: the walk of jobs_claim_idx from the queue's
-- first entry). For `claim_flow` of several given queues the custom plans are kept: one made for
-- the queue names may pick jobs_claim_idx.
-- The session's own setting is kept in a placeholder variable and put back, both transaction-local
-- (is_local): no statement of a handler runs under this setting, and a ROLLBACK ends it too.
SELECT set_config('skiplock.plan_cache_mode', current_setting('plan_cache_mode'), true),
       set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: plan_cache_mode_back
-- See `generic_plan_for_claim`.
SELECT set_config('plan_cache_mode', current_setting('skiplock.plan_cache_mode'), true);

-- name: release_stale_slots
-- The rescuer's pass: slots still owned by an owner no running job has (its finishing write found the
-- slot locked, see above). The candidates come from this statement's snapshot; each is re-checked as
-- it is locked (owner still the one seen: a slot taken again since by a new owner is left alone) and
-- a locked one is skipped -- it is tried again next pass. Returns how many were freed.
WITH stale AS MATERIALIZED (
SELECT f.key, f.n, f.owner FROM {schema}.flow_slots f
 WHERE f.owner IS NOT NULL AND NOT EXISTS (SELECT FROM {schema}.jobs j WHERE j.owner = f.owner)),
mine AS (
SELECT f.key, f.n FROM {schema}.flow_slots f JOIN stale s ON s.key = f.key AND s.n = f.n
 WHERE f.owner = s.owner
   FOR UPDATE OF f SKIP LOCKED),
upd AS (
UPDATE {schema}.flow_slots f SET owner = NULL FROM mine WHERE f.key = mine.key AND f.n = mine.n RETURNING 1)
SELECT count(*) FROM upd;

-- name: ensure_slots
-- The slots (key, 1..limit) of limited keys, created once (autocommit, on the bookkeeping session:
-- never in a lease). ON CONFLICT DO NOTHING: rows that exist -- locked or owned -- are left alone.
INSERT INTO {schema}.flow_slots (key, n)
SELECT w.key, generate_series(1, w.lim)
  FROM unnest(%(keys)b::text[], %(lims)b::int[]) AS w(key, lim)
ON CONFLICT (key, n) DO NOTHING;

-- name: own_slots
-- Claimed lease, in the claim transaction (which holds these slots' row locks): the slots now
-- belong to the job's owner and outlive the transaction; see the invariants above for who frees them.
UPDATE {schema}.flow_slots f SET owner = %(owner)s::uuid
  FROM unnest(%(keys)b::text[], %(ns)b::int[]) AS w(key, n)
 WHERE f.key = w.key AND f.n = w.n;

-- name: ensure_rates
INSERT INTO {schema}.flow_rates (key, tat)
SELECT unnest(%(keys)b::text[]), '-infinity'
ON CONFLICT (key) DO NOTHING;

-- name: take_starts
-- Rate limits, GCRA (the virtual-scheduling form of a token bucket of one): a key allows a start
-- when its theoretical arrival time `tat` has come, and the start moves it to greatest(tat, now) +
-- %(every)s seconds -- starts are spaced evenly, never bunched at the edge of a window. All the
-- keys of one job or none: their rows are locked in key order (no deadlock between two callers),
-- only by statements like this one (autocommit, short), and moved only if every key allows it.
-- Returns (granted, every key's row exists, the keys that refused and how long until each allows).
WITH t AS MATERIALIZED (SELECT clock_timestamp() AS at),
want AS (SELECT * FROM unnest(%(keys)s::text[], %(every)s::float8[]) AS w(key, every)),
cur AS MATERIALIZED (
SELECT r.key, r.tat FROM {schema}.flow_rates r WHERE r.key = ANY(%(keys)s::text[]) ORDER BY r.key FOR UPDATE),
ok AS MATERIALIZED (
SELECT (SELECT count(*) FROM cur) = cardinality(%(keys)s::text[])
       AND NOT EXISTS (SELECT FROM cur, t WHERE cur.tat > t.at) AS granted),
upd AS (
UPDATE {schema}.flow_rates r SET tat = greatest(r.tat, t.at) + w.every * interval '1 second'
  FROM want w, ok, t
 WHERE ok.granted AND r.key = w.key
RETURNING r.key)
SELECT ok.granted, (SELECT count(*) FROM cur) = cardinality(%(keys)s::text[]),
       ARRAY(SELECT cur.key FROM cur, t WHERE cur.tat > t.at ORDER BY cur.key),
       ARRAY(SELECT extract(epoch FROM cur.tat - t.at)::float8 FROM cur, t WHERE cur.tat > t.at ORDER BY cur.key),
       (SELECT count(*) FROM upd)
  FROM ok;

-- name: queue_limited_now
-- `set_queue_limit`'s first step, in its transaction: whether the queue has limits now (NULL: no
-- row), its row locked against another change (FOR NO KEY UPDATE: not against the enqueues' KEY SHARE).
SELECT limited
  FROM {schema}.queue_limits WHERE queue = %(queue)s FOR NO KEY UPDATE;

-- name: set_queue_limit
-- Per-queue limits (`skiplock limit`). Running workers read the new row at their next claim.
-- %(weights)s: a fair queue's partition weights (migration 16), a JSON object. Clearing a queue's
-- limits writes them NULL here (the row "retiring", still the flow claim's queue), then
-- `retire_queue_limit` deletes the row when no job of the queue is flagged any more.
INSERT INTO {schema}.queue_limits AS l (queue, concurrency, rate_count, rate_period, fair, weights)
VALUES (%(queue)s, %(concurrency)s, %(rate_count)s, %(rate_period)s, %(fair)s, %(weights)s::jsonb)
ON CONFLICT (queue) DO UPDATE
   SET concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count, rate_period = EXCLUDED.rate_period,
       fair = EXCLUDED.fair, weights = EXCLUDED.weights, updated_at = now();

-- name: flag_queue_jobs
-- After a queue got limits (it had none, or no row), in the same transaction: its unfinished jobs get
-- the `flow` flag (migration 17), so the plain claims over several queues stop walking them. One
-- walk of the queue's unfinished jobs (see below), once per change. A job locked now -- in a running
-- transaction lease -- is skipped and keeps no flag: it is still the flow claim's (its filters), and
-- costs the plain claims a row read until it ends. The row is this transaction's (I1 holds).
-- The states as two arms, each an index's: the queued jobs in jobs_claim_idx, the others in
-- jobs_state_queue_idx (which holds no queued job since migration 20; `state IN ('queued', ...)`
-- proves neither index's predicate, and was a sequential scan of every finished job).
-- The rows are then written by id, as an array: a join of the two could hash the whole table.
UPDATE {schema}.jobs SET flow = true
 WHERE id = ANY(ARRAY(SELECT id FROM {schema}.jobs
                       WHERE queue = %(queue)s AND NOT flow
                         AND (state = 'queued' OR (state IN ('running', 'blocked') AND state <> 'queued'))
                         FOR UPDATE SKIP LOCKED));

-- name: clear_queue_limit
-- No limits left: the row stays, without limits, until `retire_queue_limit` deletes it.
UPDATE {schema}.queue_limits
   SET concurrency = NULL, rate_count = NULL, rate_period = NULL, fair = false, weights = '{{}}'::jsonb,
       updated_at = now()
 WHERE queue = %(queue)s
RETURNING queue;

-- name: retiring_queue_limits
SELECT queue FROM {schema}.queue_limits
 WHERE NOT limited ORDER BY queue;

-- name: retire_lock
-- `retire_queue_limit`, step 1 (its transaction, under a short lock_timeout): the row of a queue
-- without limits, locked FOR UPDATE -- which waits for the enqueues that locked it FOR KEY SHARE
-- while it still had limits (`flow_hint_of_one`) to end, and holds back new ones (they wait, then
-- find no row or no limits and set no flag). No row: nothing to do (gone, or limited again).
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       EXISTS (SELECT FROM {schema}.queue_limits
                WHERE queue = %(queue)s AND NOT limited
                  FOR UPDATE);

-- name: unflag_queue_jobs
-- Step 2: the queue's flagged unfinished jobs lose the flag (jobs_flow_idx), but those locked now
-- (a running transaction lease): they keep it, and the row stays for them.
UPDATE {schema}.jobs SET flow = false
 WHERE id IN (SELECT id FROM {schema}.jobs
               WHERE queue = %(queue)s AND flow AND state IN ('queued', 'running', 'blocked')
                 FOR UPDATE SKIP LOCKED);

-- name: retire_queue_limit
-- Step 3, a new statement (its snapshot sees every enqueue that step 1 waited for, and the committed
-- rows of the jobs step 2 skipped): the row is deleted only if no unfinished job of the queue is
-- flagged (I1, migration 17). Returns the queue if deleted.
DELETE FROM {schema}.queue_limits l
 WHERE l.queue = %(queue)s
   AND NOT EXISTS (SELECT FROM {schema}.jobs
                    WHERE queue = %(queue)s AND flow AND state IN ('queued', 'running', 'blocked'))
RETURNING l.queue;

-- name: queue_limits
-- The rows with limits; with %(retiring)s, also those without (retiring: `clear_queue_limit`; the
-- worker's flow claim still serves their queue, the readers leave them out).
SELECT queue, concurrency, rate_count, rate_period, updated_at, fair, weights FROM {schema}.queue_limits
 WHERE limited OR %(retiring)s ORDER BY queue;

-- name: set_task_limit
-- A task's limits at runtime (migration 16; `skiplock limit --task`): they replace the code's in every
-- worker with the task at its next refresh. The caller deletes the row to go back to the code's.
INSERT INTO {schema}.task_limits AS l (task, concurrency, rate_count, rate_period)
VALUES (%(task)s, %(concurrency)s, %(rate_count)s, %(rate_period)s)
ON CONFLICT (task) DO UPDATE
   SET concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count, rate_period = EXCLUDED.rate_period,
       updated_at = now();

-- name: clear_task_limit
DELETE FROM {schema}.task_limits WHERE task = %(task)s RETURNING task;

-- name: task_limits
SELECT task, concurrency, rate_count, rate_period, updated_at FROM {schema}.task_limits ORDER BY task;

-- name: worker_seen
-- A worker says it is alive, with what it can take: inserted at start, last_seen refreshed every few
-- seconds. Rows of workers that died without deleting theirs are deleted after an hour (never this
-- worker's own row: one statement must not both delete and update it).
-- Also says which process it is (host, OS pid) and how many slots it runs (migration 9; NULL if the
-- caller does not say).
WITH stale AS (DELETE FROM {schema}.workers WHERE last_seen < now() - interval '1 hour' AND id <> %(id)s)
INSERT INTO {schema}.workers AS w (id, name, tasks, queues, host, pid, concurrency)
VALUES (%(id)s, %(name)s, %(tasks)s::text[], %(queues)s::text[], %(host)s, %(pid)s, %(concurrency)s)
ON CONFLICT (id) DO UPDATE SET last_seen = now(), tasks = EXCLUDED.tasks, queues = EXCLUDED.queues,
                               host = EXCLUDED.host, pid = EXCLUDED.pid, concurrency = EXCLUDED.concurrency;

-- name: worker_gone
DELETE FROM {schema}.workers WHERE id = %(id)s;

-- name: live_workers
-- Workers seen within %(live)s seconds.
SELECT count(*) FROM {schema}.workers WHERE last_seen > now() - %(live)s::float8 * interval '1 second';

-- name: untakeable
-- Queued jobs no running worker can take, by queue and task: no worker seen within %(live)s seconds
-- has the task registered and serves the queue (queues NULL: every queue). They wait, untouched.
WITH q AS (SELECT queue, task, count(*) AS n FROM {schema}.jobs WHERE state = 'queued' GROUP BY queue, task)
SELECT q.queue, q.task, q.n
  FROM q
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.workers w
                    WHERE w.last_seen > now() - %(live)s::float8 * interval '1 second'
                      AND q.task = ANY(w.tasks) AND (w.queues IS NULL OR q.queue = ANY(w.queues)))
 ORDER BY q.queue, q.task;


-- ==== the read model (src/skiplock/readmodel.py) =============================================
-- What is running, who runs it, what failed, what waits: read-only statements for `skiplock status`,
-- `skiplock jobs`, `skiplock workers` and a dashboard. None takes a lock or writes.
--
-- "In flight" (running now), per lease mode:
-- * claimed lease: the job's row says 'running' (start_claimed committed it). It stays so until its
--   fenced finishing write, or until the rescuer returns it once its lease expired (lease_expires_at
--   in the past: its worker stopped renewing it) -- shown until then, with that time.
-- * transaction lease: the row still says 'queued' (it is locked by the lease transaction, and its
--   writes are not committed). Before its handler starts, `start_attempt` wrote, on a separate
--   autocommit connection, the attempt (job_attempts.started, one more than jobs.attempts until the
--   outcome commits), the slot, the lease session's backend pid and when (started_at). The attempt
--   is in flight while: the row is still 'queued' with fewer attempts than started (no finishing
--   write committed: `complete` deletes the job_attempts row, `record_outcome` raises jobs.attempts
--   to it, or lowers `started` for a snooze); no error is pending for that attempt (pending_errors:
--   it finished, its outcome was not written); and the lease session is alive in pg_stat_activity
--   with its transaction begun no later than the attempt (xact_start <= started_at: a pid reused by a
--   later session, or the same session in a later transaction, is not it). So an attempt whose
--   session crashed (a SIGKILLed worker, a lost connection, an abort) is not in flight as soon as the
--   server has ended that session; until then (a vanished host: at most the keepalive /
--   tcp_user_timeout bound or lease_timeout, see docs/guarantees.md) it is still shown.
--   The test is written once, in the views `attempts_in_flight` and `lease_sessions` (migration 10);
--   each statement reads it once (a materialized CTE), never per row. A role that
--   cannot see the worker sessions' xact_start (another role's, without pg_read_all_stats) sees no
--   transaction-lease job in flight.
-- * jobs of a batch (several jobs claimed in one transaction: `start_batch`) get no attempt row
--   before each handler: which of them runs is not recorded, so none is shown running; the batch
--   itself is shown by `batches_in_flight`. A suspect running alone in a batch's transaction has
--   its own attempt row, and is shown.
-- The slot name is "<worker name>/<slot number>"; the worker's process (host, pid) comes from its
-- row in `workers` (the newest one of that name).

-- name: running_now
-- Every job in flight (see above), by job id, a page at a time: %(after)s is the last id of the
-- previous page (NULL: the first page), %(limit)s the page size.
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight),
running AS (
SELECT f.job_id, 'transaction' AS lease, f.attempt, f.slot, f.since, NULL::timestamptz AS lease_expires_at
  FROM in_flight f
UNION ALL
SELECT j.id, 'claimed', j.attempts, j.worker, j.started_at, j.lease_expires_at
  FROM {schema}.jobs j
 WHERE j.state = 'running')
SELECT r.job_id, j.queue, j.task, r.lease, r.attempt, j.max_attempts,
       regexp_replace(r.slot, '/[0-9]+$', '') AS worker, substring(r.slot FROM '/([0-9]+)$')::int AS slot,
       r.since, r.lease_expires_at, w.host, w.pid, w.last_seen, now() AS read_at
  FROM running r JOIN {schema}.jobs j ON j.id = r.job_id
       LEFT JOIN LATERAL (SELECT host, pid, last_seen FROM {schema}.workers
                           WHERE name = regexp_replace(r.slot, '/[0-9]+$', '')
                           ORDER BY last_seen DESC LIMIT 1) w ON true
 WHERE (%(after)s::bigint IS NULL OR r.job_id > %(after)s)
 ORDER BY r.job_id
 LIMIT %(limit)s;

-- name: list_running_jobs
-- `list_jobs` for state 'running': the jobs `running_now` lists, newest first, keyset on %(before)s.
-- Read through the (small) in-flight set, not by scanning the jobs table.
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight),
ids AS (SELECT job_id AS id FROM in_flight UNION ALL SELECT id FROM {schema}.jobs WHERE state = 'running')
SELECT j.id, j.queue, j.task, j.args, j.priority, 'running' AS state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, coalesce(f.since, j.started_at) AS started_at, j.finished_at,
       coalesce(a.pending_errors -> -1 ->> 'error', j.last_error) AS last_error,
       j.errors || coalesce(a.pending_errors, '[]'::jsonb) AS errors,
       j.result, coalesce(f.slot, j.worker) AS worker, j.unique_key, j.lease_expires_at
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
       LEFT JOIN in_flight f ON f.job_id = j.id
 WHERE j.id IN (SELECT id FROM ids)
   AND (j.state = 'running' OR f.job_id IS NOT NULL)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(before)s::bigint IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: batches_in_flight
-- Batches whose transaction is open now (their row, written by `start_batch`, is deleted by their
-- COMMIT; a live session whose transaction began no later than the row is theirs -- the same test as
-- `running_now`'s): slot, since, and how many of their jobs they still hold (still queued). Which
-- of those jobs runs at this moment is not recorded. By batch id, keyset on %(after)s.
WITH live AS MATERIALIZED (SELECT * FROM {schema}.lease_sessions)
SELECT b.id, regexp_replace(b.worker, '/[0-9]+$', '') AS worker, substring(b.worker FROM '/([0-9]+)$')::int AS slot,
       b.started_at,
       (SELECT count(*) FROM {schema}.jobs j WHERE j.id = ANY(b.ids) AND j.state = 'queued') AS jobs
  FROM {schema}.job_batches b
 WHERE EXISTS (SELECT FROM live s WHERE s.pid = b.backend_pid AND s.xact_start <= b.started_at)
   AND (%(after)s::bigint IS NULL OR b.id > %(after)s)
 ORDER BY b.id
 LIMIT %(limit)s;

-- name: live_worker_rows
-- Every worker seen within %(live)s seconds (its row refreshed by `worker_seen`; deleted when it
-- exits): oldest first, keyset on (started_at, id) after (%(after_started)s, %(after_id)s) -- both
-- NULL for the first page. With how many jobs each runs now (its slots' names in `running_now`'s
-- sense: the row's name before "/<slot>"; claimed-lease rows and transaction-lease attempts in flight).
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight),
slots AS (
SELECT regexp_replace(slot, '/[0-9]+$', '') AS name FROM in_flight
UNION ALL
SELECT regexp_replace(worker, '/[0-9]+$', '') FROM {schema}.jobs WHERE state = 'running'),
busy AS (SELECT name, count(*) AS n FROM slots GROUP BY name)
SELECT w.id, w.name, w.host, w.pid, w.tasks, w.queues, w.concurrency, w.started_at, w.last_seen,
       coalesce(busy.n, 0) AS running, now() AS read_at
  FROM {schema}.workers w LEFT JOIN busy ON busy.name = w.name
 WHERE w.last_seen > now() - %(live)s::float8 * interval '1 second'
   AND (%(after_started)s::timestamptz IS NULL OR (w.started_at, w.id) > (%(after_started)s, %(after_id)s::uuid))
 ORDER BY w.started_at, w.id
 LIMIT %(limit)s;

-- name: failure_classes
-- Failed jobs by queue and error class: the text before the first ':' of last_error's first line
-- (an exception's type, "Type: message", or skiplock's own reasons: "gave up", "lease expired",
-- "unknown task ..."), when that text is 1 to 200 characters long, else 'other'. (Written with
-- strpos/split_part, not a regular expression: '^([^:\n]{{1,200}}):' means the same, and cost about
-- 60 us a row -- most of the overview's time at 1,000,000 jobs; the same expression is in
-- dash_find_jobs and dash_matching_ids, and tests/dashboard/test_scale.py checks they agree.) With the newest failure's time. Most frequent first. Only those
-- failed since %(since)s if given (jobs_finished_idx: a range of finished_at, not every failed job kept).
SELECT queue, CASE WHEN strpos(split_part(last_error, E'\n', 1), ':') BETWEEN 2 AND 201 THEN split_part(last_error, ':', 1) ELSE 'other' END AS error_class,
       count(*) AS n, max(finished_at) AS last_failed_at
  FROM {schema}.jobs
 WHERE state = 'failed' AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s)
 GROUP BY 1, 2
 ORDER BY n DESC, 1, 2;

-- name: oldest_ready
-- Per queue, the queued jobs due now (run_at passed) that are not in flight (see `running_now`; a
-- transaction-lease job's row still says 'queued' while it runs): how many, and the oldest one's
-- due time and age (how long the head of the queue has waited). Whether the queue is paused.
WITH in_flight AS MATERIALIZED (SELECT * FROM {schema}.attempts_in_flight)
SELECT j.queue, count(*) AS ready, min(j.run_at) AS oldest_run_at, now() - min(j.run_at) AS age,
       EXISTS (SELECT FROM {schema}.paused_queues p WHERE p.queue = j.queue) AS paused
  FROM {schema}.jobs j
 WHERE j.state = 'queued' AND j.run_at <= now()
   AND NOT EXISTS (SELECT FROM in_flight f WHERE f.job_id = j.id)
 GROUP BY j.queue
 ORDER BY j.queue;

-- ==== the dashboard's reads and writes (skiplock.dashboard; Python in reads.py) ================
-- Every statement here runs in a transaction with a local statement_timeout (`dash_timeout`), is
-- bounded by a LIMIT, pages by keyset (never OFFSET), and reads pg_stat_activity at most once per
-- statement (the attempts_in_flight view, MATERIALIZED), never per row.

-- name: dash_timeout
-- The next statements of this transaction are ended by the server past %(ms)s milliseconds.
SELECT set_config('statement_timeout', %(ms)s, true);

-- name: dash_walk_indexes
-- Sent before the queue summary's two statements, in their transaction: no sequential scan of a
-- table for the rest of it. Their lateral counts ("at most %(cap)s + 1 rows of this (state, queue)")
-- have a LIMIT the planner cannot know, so it guesses a tenth of the pair's rows and then finds a
-- sequential scan "until that many match" about as cheap as the walk of jobs_state_queue_idx
-- whenever the visibility map is not all set (a busy table; a fresh one) -- and such a scan reads the
-- whole table when the pair's rows are at its end (queued jobs behind a million done ones).
-- tests/dashboard/test_scale.py checks both statements' plans with and without a vacuum.
SELECT set_config('enable_seqscan', 'off', true);

-- fragment: finished_window
-- The jobs finished in the last %(seconds)s seconds, one range of jobs_finished_idx (state,
-- finished_at; migration 22) per finished state: bounded by the jobs finished in that window,
-- whatever the table's size. One arm per state, each naming its state: `state IN (...)` is implied by
-- the index's predicate, so the planner drops it from the index conditions and, before PostgreSQL
-- 18's skip scan, would read the whole index for a range on its second column.
SELECT state, run_at, started_at, finished_at FROM {schema}.jobs
 WHERE state = 'done' AND finished_at >= now() - %(seconds)s::float8 * interval '1 second'
UNION ALL
SELECT state, run_at, started_at, finished_at FROM {schema}.jobs
 WHERE state = 'failed' AND finished_at >= now() - %(seconds)s::float8 * interval '1 second'
UNION ALL
SELECT state, run_at, started_at, finished_at FROM {schema}.jobs
 WHERE state = 'cancelled' AND finished_at >= now() - %(seconds)s::float8 * interval '1 second'

-- name: dash_throughput
-- Jobs finished in the last %(seconds)s seconds, per minute: done, failed, cancelled
-- (`finished_window`); at most seconds/60 + 1 rows.
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE state = 'done') AS done,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled
  FROM (
-- include: finished_window
       ) f
 GROUP BY 1
 ORDER BY 1;

-- name: dash_pickup_latency
-- Queue latency of the jobs finished in the last %(seconds)s seconds: from when each became due
-- (run_at: enqueued, or its retry's due time) to when its last attempt started (started_at) --
-- how long a ready job waited for a worker, wake-up included. Median, 95th percentile, worst, and
-- how many jobs. The ranges of jobs_finished_idx of `dash_throughput` (`finished_window`).
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY w),
       max(w), count(w)
  FROM (SELECT extract(epoch FROM greatest(started_at - run_at, interval '0')) AS w
          FROM (
-- include: finished_window
               ) f
         WHERE started_at IS NOT NULL) l;

-- name: dash_find_jobs
-- The jobs matching a filter, newest first, keyset on id < %(before)s, at most %(limit)s. Each
-- filter is optional (NULL: any). State as the read model shows it: a transaction-lease job in
-- flight (its row says 'queued', see attempts_in_flight) is 'running', and 'queued' leaves it out.
-- error_class: as `failure_classes` computes it. since/until: the job's created_at. args: a
-- case-insensitive substring of the args' JSON text. id_floor: only ids >= it (an args search reads
-- one window of ids at a time, see `dash_id_floor`; NULL: no floor). The scan walks the primary key
-- backwards and stops at %(limit)s rows or at id_floor; a filter that matches few rows may read many
-- (statement_timeout bounds it), but not an args search: at most its window of ids.
WITH in_flight AS MATERIALIZED (SELECT job_id FROM {schema}.attempts_in_flight)
SELECT j.id, j.queue, j.task,
       CASE WHEN j.state = 'queued' AND j.id IN (SELECT job_id FROM in_flight) THEN 'running' ELSE j.state END AS state,
       j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.started_at, j.finished_at,
       left(j.last_error, 300) AS last_error, j.worker
  FROM {schema}.jobs j
 WHERE (%(state)s::text IS NULL
        OR (%(state)s = 'running' AND (j.state = 'running' OR (j.state = 'queued' AND j.id IN (SELECT job_id FROM in_flight))))
        OR (%(state)s = 'queued' AND j.state = 'queued' AND j.id NOT IN (SELECT job_id FROM in_flight))
        OR (%(state)s NOT IN ('running', 'queued') AND j.state = %(state)s))
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(error_class)s::text IS NULL
        OR CASE WHEN strpos(split_part(j.last_error, E'\n', 1), ':') BETWEEN 2 AND 201 THEN split_part(j.last_error, ':', 1) ELSE 'other' END = %(error_class)s)
   AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR j.created_at < %(until)s)
   AND (%(args)s::text IS NULL OR strpos(lower(j.args::text), lower(%(args)s)) > 0)
   AND (%(id_floor)s::bigint IS NULL OR j.id >= %(id_floor)s)
   AND (%(before)s::bigint IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: dash_id_floor
-- Where an args-text search of the ids below %(before)s (NULL: every id) stops: %(window)s ids down,
-- from the newest id (max(id): one probe of the primary key). No id is skipped: the next window starts
-- where this one ended (the caller's cursor). Below 1 means the window reaches the first job.
SELECT coalesce(%(before)s::bigint, (SELECT max(id) + 1 FROM {schema}.jobs), 1) - %(window)s::bigint;

-- name: dash_matching_ids
-- The ids of the jobs matching the same filter as `dash_find_jobs` (same WHERE), newest first,
-- keyset on id < %(before)s, at most %(limit)s: what a bulk action counts and then acts on.
WITH in_flight AS MATERIALIZED (SELECT job_id FROM {schema}.attempts_in_flight)
SELECT j.id
  FROM {schema}.jobs j
 WHERE (%(state)s::text IS NULL
        OR (%(state)s = 'running' AND (j.state = 'running' OR (j.state = 'queued' AND j.id IN (SELECT job_id FROM in_flight))))
        OR (%(state)s = 'queued' AND j.state = 'queued' AND j.id NOT IN (SELECT job_id FROM in_flight))
        OR (%(state)s NOT IN ('running', 'queued') AND j.state = %(state)s))
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(error_class)s::text IS NULL
        OR CASE WHEN strpos(split_part(j.last_error, E'\n', 1), ':') BETWEEN 2 AND 201 THEN split_part(j.last_error, ':', 1) ELSE 'other' END = %(error_class)s)
   AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR j.created_at < %(until)s)
   AND (%(args)s::text IS NULL OR strpos(lower(j.args::text), lower(%(args)s)) > 0)
   AND (%(id_floor)s::bigint IS NULL OR j.id >= %(id_floor)s)
   AND (%(before)s::bigint IS NULL OR j.id < %(before)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: dash_delete_finished
-- Delete the given jobs that are finished (done, failed, cancelled) and not locked: a queued or
-- running job is never deleted (cancel it first), and a row another transaction holds is skipped
-- (SKIP LOCKED), never waited on. Their attempt rows go with them. Returns the ids deleted.
WITH gone AS (
  DELETE FROM {schema}.jobs WHERE id IN (
    SELECT id FROM {schema}.jobs j WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('done', 'failed', 'cancelled')
       -- not a failed job holding its sequence (migration 15): retry or cancel it instead
       AND (j.sequence IS NULL OR NOT EXISTS (SELECT FROM {schema}.job_sequences s
                                               WHERE s.key = j.sequence AND s.head = j.id))
       FOR UPDATE SKIP LOCKED)
  RETURNING id),
attempts AS (DELETE FROM {schema}.job_attempts WHERE job_id IN (SELECT id FROM gone))
SELECT id FROM gone;

-- name: dash_audit_write
-- One audit row (see migration 12): who, what, on what, how many.
INSERT INTO {schema}.audit_log (actor, action, target, affected)
VALUES (%(actor)s, %(action)s, %(target)s::jsonb, %(affected)s)
RETURNING id;

-- name: dash_audit_rows
-- The audit log newest first, keyset on id < %(before)s, at most %(limit)s.
SELECT id, at, actor, action, target, affected
  FROM {schema}.audit_log
 WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- ==== the dashboard's queue summary: bounded at any table size (reads.py `queue_summary`) ======
-- Exact counts up to a cap, then an estimate; never a scan of every row. At 1,000,000 jobs a
-- GROUP BY over the table takes hundreds of milliseconds (issue 13's goal is 100 ms per page), so:
-- * the (state, queue) pairs that have jobs are found by a loose index scan (one index probe per
--   pair: the next queue after the last one found, for each state): of jobs_claim_idx for the queued
--   jobs (its leading column is the queue), of jobs_state_queue_idx for the others (since migration
--   20 it holds no queued job: each walk says `state <> 'queued'`, so the planner may use it);
-- * each pair is counted by an index-only scan of the same index stopped after %(cap)s + 1 + (the
--   jobs in flight) entries: a count above %(cap)s means "more than %(cap)s" (the caller then
--   estimates it); at most pairs x (cap + 1 + in flight) index entries are read, whatever the
--   table's size;
-- * a transaction-lease job in flight (its row says 'queued', see attempts_in_flight) is moved from
--   'queued' to 'running', as `counts` does. The queued pair's cap includes every job in flight, so
--   after the move a count is still exact up to %(cap)s, and above it still means "more".

-- name: dash_state_counts
-- (queue, state, n): n exact when <= %(cap)s, else only "more than %(cap)s" (see above).
WITH RECURSIVE in_flight AS MATERIALIZED (
  SELECT f.job_id, j.queue FROM {schema}.attempts_in_flight f JOIN {schema}.jobs j ON j.id = f.job_id),
pairs(state, queue) AS (
  SELECT 'queued', (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued')
  UNION ALL
  SELECT s.state, (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = s.state AND j.state <> 'queued')
    FROM (VALUES ('running'), ('done'), ('failed'), ('cancelled'), ('blocked')) AS s(state)
  UNION ALL
  SELECT p.state,
         CASE WHEN p.state = 'queued'
              THEN (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued' AND j.queue > p.queue)
              ELSE (SELECT min(j.queue) FROM {schema}.jobs j
                     WHERE j.state = p.state AND j.state <> 'queued' AND j.queue > p.queue) END
    FROM pairs p WHERE p.queue IS NOT NULL),
c AS (
SELECT p.queue, p.state, x.n
  FROM pairs p,
       LATERAL (SELECT count(*) AS n
                  FROM ((SELECT FROM {schema}.jobs j WHERE p.state = 'queued' AND j.state = 'queued' AND j.queue = p.queue
                          LIMIT %(cap)s + 1 + (SELECT count(*) FROM in_flight))
                        UNION ALL
                        (SELECT FROM {schema}.jobs j
                          WHERE p.state <> 'queued' AND j.state = p.state AND j.state <> 'queued' AND j.queue = p.queue
                          LIMIT %(cap)s + 1)) capped) x
 WHERE p.queue IS NOT NULL
UNION ALL
SELECT f.queue, m.state, m.n FROM in_flight f, (VALUES ('queued', -1), ('running', 1)) AS m(state, n))
SELECT queue, state, sum(n)::bigint AS n
  FROM c
 GROUP BY queue, state
HAVING sum(n) > 0
 ORDER BY queue, state;

-- name: dash_queue_heads
-- Per queue with queued jobs (the loose index scan of jobs_claim_idx, as above) or paused:
-- how many jobs are ready (due, not in flight), exact up to %(cap)s (a count above it means "more");
-- the head of the queue -- the ready job a worker claims next, first in the claim's order (priority,
-- run_at, id) on jobs_claim_idx -- its due time and how long it has waited (the queue's latency now: a worker
-- free to take it would have started it); whether the queue is paused. One index probe per queue
-- for the head (plus the entries ahead of it of jobs in flight or, at a more urgent priority, not yet
-- due: the claim's own cost)
-- and at most %(cap)s + 1 ready entries for the count; both walk jobs_claim_idx in its order (the
-- ORDER BY says so: without it the planner may take a sequential scan "until %(cap)s rows match",
-- which reads the whole table when the queued rows are at its end).
WITH RECURSIVE in_flight AS MATERIALIZED (SELECT job_id FROM {schema}.attempts_in_flight),
queued(queue) AS (
  SELECT (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued')
  UNION ALL
  SELECT (SELECT min(j.queue) FROM {schema}.jobs j WHERE j.state = 'queued' AND j.queue > q.queue)
    FROM queued q WHERE q.queue IS NOT NULL),
queues AS (SELECT queue FROM queued WHERE queue IS NOT NULL UNION SELECT queue FROM {schema}.paused_queues)
SELECT q.queue, r.n AS ready, h.run_at AS head_run_at, now() - h.run_at AS head_age,
       EXISTS (SELECT FROM {schema}.paused_queues p WHERE p.queue = q.queue) AS paused
  FROM queues q,
       LATERAL (SELECT count(*) AS n
                  FROM (SELECT FROM {schema}.jobs j
                         WHERE j.state = 'queued' AND j.queue = q.queue AND j.run_at <= now()
                           AND j.id NOT IN (SELECT job_id FROM in_flight)
                         ORDER BY j.queue, j.priority, j.run_at, j.id
                         LIMIT %(cap)s + 1) capped) r
       LEFT JOIN LATERAL (SELECT j.run_at FROM {schema}.jobs j
                           WHERE j.state = 'queued' AND j.queue = q.queue AND j.run_at <= now()
                             AND j.id NOT IN (SELECT job_id FROM in_flight)
                           ORDER BY j.queue, j.priority, j.run_at, j.id
                           LIMIT 1) h ON true
 ORDER BY q.queue;

-- name: dash_relation_pages
-- The jobs table's size in pages (from its file size: exact, no scan), to choose a sample's percent.
SELECT pg_relation_size(%(table)s::regclass) / current_setting('block_size')::bigint;

-- name: dash_count_sample
-- An estimate of the jobs per (queue, state): the rows of a sample of %(percent)s %% of the table's
-- pages (TABLESAMPLE SYSTEM: whole pages, each taken with that probability), scaled up. Reads about
-- that share of the pages; used only for the pairs whose exact count passed the cap. Jobs in flight
-- are not moved here (a few among the thousands this estimates).
SELECT queue, state, round(count(*) * 100.0 / %(percent)s)::bigint AS estimate
  FROM {schema}.jobs TABLESAMPLE SYSTEM (%(percent)s)
 GROUP BY queue, state;

-- name: cancel_requested
-- The asyncio worker's watch over its transaction-lease jobs in flight: which of them a
-- `cancel_job` asked to cancel (its handler's task is then cancelled; `end_lease_holder` has ended
-- or will end the lease's session, rolling its writes back, and the cancel is recorded as usual).
SELECT job_id FROM {schema}.job_cancellations WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: start_claimed_many
-- `start_claimed` for every job of one claim, in one statement (the asyncio worker's claimed lease):
-- inside the claim transaction, each row still 'queued' (we hold its lock) moves to 'running' with
-- its own owner token and lease, its attempt counted; the caller commits at once, so every attempt
-- is durable before its handler starts. Returns (id, attempt, pending cancellation reason) per row
-- moved; an id missing was not queued.
UPDATE {schema}.jobs j
   SET state = 'running', owner = s.owner, attempts = j.attempts + 1, worker = %(worker)s,
       started_at = now(), lease_expires_at = now() + s.lease * interval '1 second'
  FROM unnest(%(ids)s::bigint[], %(owners)s::uuid[], %(leases)s::float8[]) AS s(id, owner, lease)
 WHERE j.id = s.id AND j.state = 'queued'
RETURNING j.id, j.attempts, (SELECT reason FROM {schema}.job_cancellations c WHERE c.job_id = j.id);
