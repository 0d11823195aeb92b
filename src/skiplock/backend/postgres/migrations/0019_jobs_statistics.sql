-- skiplock schema, version 19: ANALYZE of the jobs table reads only what the planner uses.
--
-- ANALYZE samples 300 rows per unit of the largest statistics target among a table's columns (the
-- server's default_statistics_target, 100: 30,000 rows) and builds a most-common-values list and a
-- histogram for every column -- the JSON payloads and error texts included, which no skiplock
-- statement filters or sorts on. Migration 1 has autovacuum analyze `jobs` after every 5 % of its
-- rows changed; a queue table changes two rows' worth per job (the insert, the `done`), so at
-- thousands of jobs per second with autovacuum's 1 s naptime (the embedded server's) it runs about
-- once a second. Measured at 3,200 jobs/s on a 2-core machine: 86-398 ms per run, about a fifth of
-- a core; 58 ms for a table of 30,000 rows on a quiet machine (docs/benchmarks.md, "Session 26").
--
-- Now:
-- * no statistics for the payloads (args, result, errors, last_error): ANALYZE skips them;
-- * a target of 10 for every other column, so the sample is 3,000 rows: what the planner asks of
--   this table is the share of each state, queue, task and priority and the ranges of ids and times,
--   which a sample of that size gives (the plan tests run on these statistics). 8 ms for the same
--   30,000 rows; 22-88 ms per run at the same load.
-- How often it runs is unchanged here: a rarer ANALYZE would leave a plan made while no job was
-- queued (the table held finished jobs only) in place for longer once a burst arrives (migrations
-- 20 and 21 take that up).
-- A column added by a later migration must get a target in that migration (tests/integration/
-- test_jobs_statistics.py checks every column): one column at the default brings the 30,000-row
-- sample back.
-- SET STATISTICS takes a SHARE UPDATE EXCLUSIVE lock on the table: claims, enqueues and `done`
-- writes go on while this runs.
ALTER TABLE {schema}.jobs
    ALTER COLUMN args SET STATISTICS 0,
    ALTER COLUMN result SET STATISTICS 0,
    ALTER COLUMN errors SET STATISTICS 0,
    ALTER COLUMN last_error SET STATISTICS 0,
    ALTER COLUMN id SET STATISTICS 10,
    ALTER COLUMN queue SET STATISTICS 10,
    ALTER COLUMN task SET STATISTICS 10,
    ALTER COLUMN priority SET STATISTICS 10,
    ALTER COLUMN state SET STATISTICS 10,
    ALTER COLUMN attempts SET STATISTICS 10,
    ALTER COLUMN max_attempts SET STATISTICS 10,
    ALTER COLUMN run_at SET STATISTICS 10,
    ALTER COLUMN created_at SET STATISTICS 10,
    ALTER COLUMN started_at SET STATISTICS 10,
    ALTER COLUMN finished_at SET STATISTICS 10,
    ALTER COLUMN worker SET STATISTICS 10,
    ALTER COLUMN unique_key SET STATISTICS 10,
    ALTER COLUMN owner SET STATISTICS 10,
    ALTER COLUMN lease_expires_at SET STATISTICS 10,
    ALTER COLUMN partition SET STATISTICS 10,
    ALTER COLUMN sequence SET STATISTICS 10,
    ALTER COLUMN sequence_on_failure SET STATISTICS 10,
    ALTER COLUMN flow SET STATISTICS 10;
