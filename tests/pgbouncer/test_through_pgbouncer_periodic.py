"""Cron (tests/integration/test_periodic.py: each tick enqueued exactly once, by concurrent schedulers
too; a worker runs the scheduler) through PgBouncer, in transaction and in session pooling mode (see
conftest.py): the same tests, unchanged."""

from test_periodic import (  # noqa: F401
    test_a_worker_runs_the_scheduler_and_the_periodic_job,
    test_missed_ticks_are_skipped_by_default_and_run_once_on_request,
    test_ten_schedulers_on_one_tick_enqueue_exactly_one_job,
)
