-- Statements of skiplock.testing (helpers for users' tests). Each runs on the test's own
-- connection, inside its transaction, which the test rolls back (skiplock.testing.rolled_back).

-- name: jobs_in_transaction
-- assert_enqueued on a connection: the jobs that connection's transaction sees (its own uncommitted
-- ones too), in id order, as get_job shows them; %(state)s NULL means every state.
SELECT j.id, j.queue, j.task, j.args, j.priority, j.state,
       greatest(j.attempts, coalesce(a.started, 0)) AS attempts,
       j.max_attempts, j.run_at, j.created_at, j.started_at, j.finished_at,
       coalesce(a.pending_errors -> -1 ->> 'error', j.last_error) AS last_error,
       j.errors || coalesce(a.pending_errors, '[]'::jsonb) AS errors,
       j.result, j.worker, j.unique_key, j.lease_expires_at
  FROM {schema}.jobs j LEFT JOIN {schema}.job_attempts a ON a.job_id = j.id
 WHERE (%(state)s::text IS NULL OR j.state = %(state)s)
 ORDER BY j.id;

-- name: finish_inline
-- run_inline: the job it enqueued in the caller's transaction and ran there ends as a worker's
-- successful first run would -- done, attempt 1, with its result. Guarded on 'queued' like every
-- finishing write (the handler itself may have finished or cancelled its row: then nothing changes).
UPDATE {schema}.jobs
   SET state = 'done', attempts = 1, started_at = %(started_at)s, finished_at = clock_timestamp(),
       result = %(result)s::jsonb, worker = %(worker)s
 WHERE id = %(id)s AND state = 'queued'
RETURNING id;
