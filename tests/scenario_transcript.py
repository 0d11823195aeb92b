"""The transcript part of the user's seed, shared by the scenario's tests on PostgreSQL
(tests/integration/test_scenario.py) and on MariaDB (tests/mysql/test_mysql_tools.py)."""

# The transcript part of the user's seed (job-queue-on-skip-locked.txt), verbatim, trailing spaces included.
SEED_TRANSCRIPT = """\
A> BEGIN;
BEGIN

A> SELECT id, task FROM jobs WHERE state = 'queued'
   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;
 id |        task        \n\
----+--------------------
  1 | send welcome email \n\
(1 row)

B> BEGIN;
BEGIN

B> SELECT id, task FROM jobs WHERE state = 'queued'
   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED; -- job 1 is claimed \u2014 skipped without waiting
 id |       task       \n\
----+------------------
  2 | generate invoice \n\
(1 row)

A marks job 1 done and commits. B explicitly rolls back; no worker process is killed.

A> UPDATE jobs SET state = 'done' WHERE id = 1;
UPDATE 1

A> COMMIT;
COMMIT

B> ROLLBACK;
ROLLBACK

B selects job 2 again after rollback. This checks row availability, not the number of external effects.

B> BEGIN;
BEGIN

B> SELECT id, task FROM jobs WHERE state = 'queued'
   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;
 id |       task       \n\
----+------------------
  2 | generate invoice \n\
(1 row)

B> UPDATE jobs SET state = 'done' WHERE id = 2;
UPDATE 1

B> COMMIT;
COMMIT

A> SELECT id, state FROM jobs ORDER BY id;
 id | state \n\
----+-------
  1 | done  \n\
  2 | done  \n\
(2 rows)
"""
