-- skiplock schema, version 9: the workers table says which process each worker is, and how many slots it runs.
--
-- The read model (src/skiplock/readmodel.py: `skiplock workers`, `skiplock status`, a dashboard) shows
-- every live worker process and what it runs without asking the server about its sessions row by row:
-- each worker writes, with its name, tasks and queues (migration 7), the host it runs on, its OS process
-- id and its number of slots, at start and at every refresh. NULL: a row written by a worker of an
-- older skiplock (shown as unknown). Advisory, like the rest of the table: it decides what is shown,
-- never what is claimed.
ALTER TABLE {schema}.workers ADD COLUMN host text;
ALTER TABLE {schema}.workers ADD COLUMN pid integer;
ALTER TABLE {schema}.workers ADD COLUMN concurrency integer;
