-- skiplock schema, version 10: what "in flight" means, written once, for every read-model statement.
--
-- lease_sessions: the worker lease sessions alive now, with when their transaction began (see the
-- read-model section of queries.sql). Read from pg_stat_activity: a role that cannot see the
-- workers' sessions' xact_start (another role's, without pg_read_all_stats) sees none.
CREATE VIEW {schema}.lease_sessions AS
SELECT pid, xact_start FROM pg_stat_activity
 WHERE application_name LIKE 'skiplock-worker%' AND xact_start IS NOT NULL;

-- attempts_in_flight: transaction-lease attempts whose handler runs now: started (job_attempts one
-- ahead of the job's row, which is still 'queued'), no error pending for that attempt, and its lease
-- session alive with its transaction begun no later than the attempt (a reused pid, or the same
-- session in a later transaction, is not it).
CREATE VIEW {schema}.attempts_in_flight AS
SELECT a.job_id, a.started AS attempt, a.worker AS slot, a.started_at AS since
  FROM {schema}.job_attempts a JOIN {schema}.jobs j ON j.id = a.job_id
 WHERE j.state = 'queued' AND a.started > j.attempts
   AND (a.pending_errors -> -1 ->> 'attempt') IS DISTINCT FROM a.started::text
   AND EXISTS (SELECT FROM {schema}.lease_sessions s WHERE s.pid = a.backend_pid AND s.xact_start <= a.started_at);
