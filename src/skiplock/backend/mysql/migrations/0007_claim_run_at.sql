-- skiplock's MySQL/MariaDB schema, version 7: the claim order is (priority, run_at, id), as
-- PostgreSQL's (its migration 18), and run_at is a key of both claim indexes, after priority.
-- The due jobs of a priority then come first in each index: a claim reads the entries of the jobs
-- not yet due (scheduled ahead, or waiting out a retry's backoff -- a failed job keeps its id, so in
-- (priority, id) order it sat at the head of the queue) only when no job of that priority is due,
-- and tests `run_at` on the index entry (index condition pushdown), never on the row. Jobs enqueued
-- one after another keep their order (run_at is the enqueue time when none is given); a retried job
-- comes back in the order of its retry time. Still per claim, not a global FIFO.
--
-- One ALTER per index drops the old key and adds the new one under the same name, atomically; a
-- step cut after its DDL but before its record runs again to the same result (the key it drops is
-- then the new one). InnoDB builds them in place (ALGORITHM=INPLACE, LOCK=NONE): writers are not
-- blocked while they build (the ALTER's metadata lock still waits for the transactions open on the
-- table, running jobs' included, and holds new ones back meanwhile). Workers of an earlier version
-- still ask for `ORDER BY priority, id`, which these keys cannot give without a filesort (which locks
-- every candidate row): stop them before migrating, or restart them right after.

-- step: jobs_claim_run_at
ALTER TABLE {jobs} DROP KEY jobs_claim, ADD KEY jobs_claim (state, queue, priority, run_at, id), ALGORITHM=INPLACE, LOCK=NONE;

-- step: jobs_claim_any_run_at
ALTER TABLE {jobs} DROP KEY jobs_claim_any, ADD KEY jobs_claim_any (state, priority, run_at, id), ALGORITHM=INPLACE, LOCK=NONE;
