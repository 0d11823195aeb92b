-- skiplock schema, version 22: jobs_finished_idx is keyed by (state, finished_at), so a prune of one
-- state reads the jobs of that state past its cutoff and nothing else.
--
-- Keyed by finished_at alone, the walk of a prune (`prune` in queries.sql: one state, finished
-- before a cutoff) went through every finished job older than the cutoff, whatever its state, and
-- dropped the other states' one by one: the retentions differ (by default a day for done jobs, 7 days
-- for cancelled, 30 for failed), so each pass for done jobs read every failed and cancelled job older
-- than a day, and each pass for cancelled jobs the failed ones between 7 and 30 days old -- at 1 %
-- failures and 1,000 jobs/s, millions of rows per pass. Now each prune is one range of the index
-- (tests/integration/test_pruner.py). The dashboard's windows over every finished state
-- (`dash_throughput`, `dash_pickup_latency`) read one range per state, an arm each
-- (`finished_window` in queries.sql; tests/integration/test_finished_index.py, on PostgreSQL 15 too).
--
-- Locks (one transaction, as every migration): the new index is built first, under a new name,
-- which blocks writes to the jobs table (and so every job's finishing write) while it reads the
-- table -- but not reads or claims; then the old one is dropped and the new one renamed, which locks
-- the table against everything for the rest of this short transaction.
CREATE INDEX jobs_finished_idx_22 ON {schema}.jobs (state, finished_at) WHERE state IN ('done', 'failed', 'cancelled');
DROP INDEX {schema}.jobs_finished_idx;
ALTER INDEX {schema}.jobs_finished_idx_22 RENAME TO jobs_finished_idx;
