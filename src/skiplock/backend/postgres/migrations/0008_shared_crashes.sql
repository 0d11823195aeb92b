-- skiplock schema, version 8: a worker process that dies charges an attempt only to a job that ran alone.
--
-- Every attempt is counted in job_attempts before its handler starts, so that a handler that kills its
-- worker process still uses up attempts and ends 'failed'. But when a process with several slots
-- dies, every job in flight in it shows an attempt that never finished, and only one of them (at most)
-- killed it. So an unfinished attempt is charged only if it ran `exclusive`ly -- no other handler of
-- its process running meanwhile (a one-slot worker, or a suspect's run). An unfinished attempt that
-- shared its process is not charged; its job becomes a `suspect` and its next handler runs
-- exclusively in its process, where a crash is its own and is charged (see `start_attempt`).
ALTER TABLE {schema}.job_attempts ADD COLUMN exclusive boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.job_attempts ADD COLUMN suspect boolean NOT NULL DEFAULT false;
