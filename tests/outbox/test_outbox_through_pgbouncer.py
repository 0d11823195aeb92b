"""The outbox -- put in the caller's transaction, the relay in both leases, per-key ordering, retries
-- through PgBouncer, in transaction and in session pooling mode (tests/pgbouncer_server.py: this
module's ``dsn`` and ``db`` go through it). The test functions are imported unchanged from
test_outbox_put.py and test_outbox_relay.py: the same behaviour asserted."""

from pgbouncer_server import bouncer, db, direct_dsn, dsn, pooling  # noqa: F401
from test_outbox_put import (  # noqa: F401
    test_put_in_committed_transaction_is_stored_with_an_idempotency_key,
    test_put_without_conn_commits_at_once_and_autocommit_conn_works,
    test_rolled_back_transaction_publishes_nothing,
)
from test_outbox_relay import (  # noqa: F401
    test_claimed_lease_fencing_and_the_rescuer,
    test_messages_committed_out_of_id_order_are_all_delivered,
    test_receiver_returning_500_then_200_is_retried_with_backoff,
    test_transaction_lease_holds_row_locks_and_delivers,
    test_two_relays_running_together_deliver_each_message_once,
)
