-- skiplock schema, version 20: jobs_state_queue_idx no longer holds queued jobs, so no claim can
-- take it, whatever the table's statistics say.
--
-- Why: statistics made while no job was queued (a queue drained, then analyzed: every sampled row
-- 'done') estimate one queued row. A burst then arrives, and until autovacuum analyzes the table
-- again -- the server's autovacuum_naptime, a minute by default, after enough rows changed -- the
-- claims were planned as "read the queue's queued jobs by (state, queue), sort them, take the
-- first n": with one row expected, that sort looked free and jobs_state_queue_idx a little cheaper
-- than the claim index. Measured on 100,000 queued jobs behind such statistics: 26-35 ms per claim
-- of one queue and 148 ms per claim of a worker of every queue, against 0.1-0.2 ms for the walk of
-- the claim index (tests/integration/test_claim_stale_statistics.py). A cached plan is kept until
-- then, in every session.
--
-- Now the index holds the other states only. A claim (state = 'queued') can use only the partial
-- indexes made for it, which give its order without a sort, or a sequential scan whose cost is the
-- table's size. The readers that counted queued jobs with this index (the dashboard's summary, the
-- queue view's loose scan) find them in jobs_claim_idx, whose leading column is also the queue.
-- An enqueue writes one index entry less.
--
-- Locks (one transaction, as every migration): the new index is built first, under a new name,
-- which blocks writes to the jobs table (and so every job's finishing write) while it reads the
-- table -- but not reads or claims; then the old
-- one is dropped and the new one renamed, which locks the table against everything for the rest of
-- this short transaction.
CREATE INDEX jobs_state_queue_idx_20 ON {schema}.jobs (state, queue) WHERE state <> 'queued';
DROP INDEX {schema}.jobs_state_queue_idx;
ALTER INDEX {schema}.jobs_state_queue_idx_20 RENAME TO jobs_state_queue_idx;
