"""tests/integration/test_claim_of_queues.py (the merged claim of named queues) on PostgreSQL 15 (see
on_pg15.py): the same plans -- another queue's backlog, or a paused or limited one's, never read; an
index walk on pages not all-visible; one row locked at a time among many finished jobs.

Not here: ``test_a_claim_of_named_queues_does_not_read_their_jobs_not_yet_due``. PostgreSQL 15 has no
skip scan, so the walk steps over a queue's jobs not yet due of the same priority on the index (38
buffers for 5,000 of them, against at most 24 on 18), as the claim of one queue does there."""

from on_pg15 import dsn, on_postgresql_15  # noqa: F401
from test_claim_of_queues import *  # noqa: F401,F403

globals().pop("test_a_claim_of_named_queues_does_not_read_their_jobs_not_yet_due")
