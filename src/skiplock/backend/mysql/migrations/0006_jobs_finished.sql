-- skiplock's MySQL/MariaDB schema, version 6: jobs_finished (state, finished_at, run_at, started_at),
-- as PostgreSQL's jobs_finished_idx (its migration 2). The dashboard's throughput and queue latency
-- (`dash_throughput`, `dash_pickup_latency` in queries.sql) read the jobs finished in the last hour as
-- three ranges of it (one per finished state), so their cost is the jobs finished in that window,
-- whatever the table's size; run_at and started_at make it covering for the latency (no lookup of
-- each row: at 1,000,000 jobs the lookups were most of its time). Retention's `prune` (state =,
-- finished_at <) is a range of it too. Queued and running rows sit under their own state (finished_at
-- NULL) and are never read by either.
--
-- MySQL 8 has no ADD INDEX IF NOT EXISTS: a step cut after its DDL but before its record finds the
-- index there (1061, duplicate key name), which migrate counts as done (backend.py: ALREADY_THERE).
-- InnoDB builds it in place (ALGORITHM=INPLACE, LOCK=NONE): writers are not blocked while it builds.

-- step: jobs_finished
ALTER TABLE {jobs} ADD KEY jobs_finished (state, finished_at, run_at, started_at), ALGORITHM=INPLACE, LOCK=NONE;
