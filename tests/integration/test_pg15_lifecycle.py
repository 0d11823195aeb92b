"""Enqueue, cancellation, timeouts and waiting (from tests/integration/test_enqueue.py and
test_lifecycle.py) on PostgreSQL 15 (see on_pg15.py); timeouts there lack ``transaction_timeout``
(17+): the statement and idle-in-transaction timeouts end a lease (docs/guarantees.md)."""

from on_pg15 import dsn, on_postgresql_15  # noqa: F401
from test_enqueue import (  # noqa: F401
    test_a_pooled_connection_ended_by_the_server_is_replaced_not_used,
    test_enqueue_on_callers_connection_exists_only_if_committed,
    test_run_at_and_delay_are_stored,
)  # not test_enqueue_many_is_one_statement_...: its statement counter is per process, not per test
from test_lifecycle import (  # noqa: F401
    effects,
    test_cancel_queued_job_never_runs,
    test_cancel_while_running_rolls_back_and_ends_cancelled,
    test_retry_snooze_and_cancel_from_a_handler,
    test_timeout_of_a_handler_stuck_in_sleep_frees_the_slot,
    test_timeout_of_a_long_statement_is_enforced_by_postgres,
    test_unique_key_in_the_callers_transaction,
    test_wait_returns_the_result_or_raises,
)
