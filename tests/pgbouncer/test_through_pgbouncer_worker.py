"""Tests of tests/integration/test_worker.py (the transaction-lease worker) through PgBouncer, in
transaction and in session pooling mode (see conftest.py): the same tests, unchanged. A subset, for
CI time: test_pgbouncer.py drains jobs of both leases through it. Not here: the tests that kill the
app's server sessions (behind a transaction pooler that ends no client session: the pooler opens
others) and the 2,000-job drain (time)."""

from test_worker import (  # noqa: F401
    effects,
    test_a_failing_handler_is_rolled_back_retried_then_failed_with_its_reasons,
    test_a_handler_sees_its_job_running_whether_it_runs_alone_or_in_a_batch,
    test_a_lease_held_past_lease_timeout_is_ended_by_the_server,
    test_abort_rolls_back_in_flight_jobs_and_keeps_them_queued,
    test_handler_ending_the_transaction_itself_is_a_failure,
)
