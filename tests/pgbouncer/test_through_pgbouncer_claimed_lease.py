"""Tests of tests/integration/test_claimed_lease.py (the claimed lease: heartbeats, the rescuer, the
fence, cancelling a running job) through PgBouncer, in transaction and in session pooling mode (see
conftest.py): the same tests, unchanged."""

from test_claimed_lease import (  # noqa: F401
    effects,
    test_a_rescued_job_runs_again_and_the_stale_finishing_write_is_refused,
    test_claimed_failure_is_retried_and_cancel_of_a_running_claimed_job,
    test_claimed_job_is_running_with_owner_lease_and_a_committed_attempt,
    test_heartbeats_keep_a_blocked_handler_leased,
)
