-- skiplock schema, version 18: the claim order is (priority, run_at, id), and run_at is a key of
-- every claim index, so jobs not yet due never cost a claim a heap row.
--
-- Before, the claims walked their indexes in (priority, id) order and tested `run_at <= now()` on
-- each row: every job scheduled ahead (`run_at`, `delay`) or waiting out a retry's backoff -- a
-- failed job keeps its id, so it sits at the head of the claim order -- was read from the heap and
-- dropped, by every claim, until it was due (measured: 3.6-5.5 ms per claim behind 20,000 jobs due
-- in an hour). Now the due jobs of a priority come first in each index, and `run_at <= now()` is an
-- index condition: a claim that finds a due job reads a few index pages, however many jobs of its
-- priority or a later one wait for their time behind it. Jobs not yet due of a more urgent
-- priority are still ahead of it in the index: on PostgreSQL 18 the claim skips them in one descent
-- per priority (skip scan; so does a claim that finds nothing), on older servers it reads their
-- index entries -- never their rows.
--
-- The order (the claim statements' ORDER BY, and so each index's key order):
-- * priority first, as before (a smaller number runs first);
-- * then run_at: when the job became (or becomes) due. A job enqueued without a time gets its
--   transaction's start, so jobs enqueued one after another keep their enqueue order; a retried job
--   comes back in the order of its retry time, not ahead of the jobs that waited meanwhile; a job
--   scheduled for 09:00 runs before one enqueued at 09:01;
-- * then id, for jobs due at the same instant (one `enqueue_many`, one transaction).
-- It is still per claim, not a global FIFO: a locked row is skipped.
-- `task` stays the last key (migration 7); the `NOT flow` predicate stays (migration 17).
--
-- Locks (one transaction, as every migration): the new indexes are built first, under new names,
-- which blocks writes to the jobs table (and so every job's finishing write) while they build -- a
-- large backlog makes that take a while -- but not reads or claims; only then are the old ones
-- dropped and the new ones renamed, which locks the table against everything, readers included,
-- for the rest of this short transaction. Workers of an earlier version still ask for
-- `ORDER BY priority, id`, which these indexes cannot give without sorting a priority's queued jobs
-- at each claim: stop them before migrating, or restart them right after (docs/deployment.md).
CREATE INDEX jobs_claim_idx_18 ON {schema}.jobs (queue, priority, run_at, id, task) WHERE state = 'queued';
CREATE INDEX jobs_claim_any_idx_18 ON {schema}.jobs (priority, run_at, id, task) WHERE state = 'queued' AND NOT flow;
-- Fair queues (migration 13): each partition's queued jobs in the same order.
CREATE INDEX jobs_fair_idx_18 ON {schema}.jobs (queue, partition, priority, run_at, id)
    WHERE state = 'queued' AND partition IS NOT NULL;
DROP INDEX {schema}.jobs_claim_idx;
DROP INDEX {schema}.jobs_claim_any_idx;
DROP INDEX {schema}.jobs_fair_idx;
ALTER INDEX {schema}.jobs_claim_idx_18 RENAME TO jobs_claim_idx;
ALTER INDEX {schema}.jobs_claim_any_idx_18 RENAME TO jobs_claim_any_idx;
ALTER INDEX {schema}.jobs_fair_idx_18 RENAME TO jobs_fair_idx;
