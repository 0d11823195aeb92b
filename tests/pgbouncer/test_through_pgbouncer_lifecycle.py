"""Enqueue (tests/integration/test_enqueue.py) and cancellation, timeouts and waiting
(test_lifecycle.py) through PgBouncer, in transaction and in session pooling mode (see conftest.py):
the same tests, unchanged. Not here: the tests that kill the pool's server sessions or set a database
default for new sessions (behind a transaction pooler neither reaches the client's session)."""

from test_enqueue import (  # noqa: F401
    test_enqueue_on_a_dict_row_connection,
    test_enqueue_on_callers_connection_exists_only_if_committed,
    test_registered_task_defaults_apply,
)
from test_lifecycle import (  # noqa: F401
    effects,
    test_cancel_queued_job_never_runs,
    test_cancel_while_running_rolls_back_and_ends_cancelled,
    test_finishing_write_never_overwrites_a_cancellation,
    test_retry_snooze_and_cancel_from_a_handler,
    test_timeout_of_a_handler_stuck_in_sleep_frees_the_slot,
    test_timeout_of_a_long_statement_is_enforced_by_postgres,
    test_unique_key_in_the_callers_transaction,
    test_wait_returns_the_result_or_raises,
)
