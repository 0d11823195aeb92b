"""The ranges of jobs_finished_idx (test_finished_index.py, test_pruner.py) on PostgreSQL 15 (see
on_pg15.py), which has no skip scan: a range on the index's second column alone would read all of it."""

from on_pg15 import dsn, on_postgresql_15  # noqa: F401
from test_finished_index import test_the_last_hours_window_reads_that_hours_jobs_only  # noqa: F401
from test_pruner import test_a_prune_with_nothing_due_reads_none_of_the_jobs_still_kept  # noqa: F401
