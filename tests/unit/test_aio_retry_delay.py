"""The asyncio worker's wait after a failed claim (``AsyncWorker._failed``): full-jitter backoff up
to ``RETRY_CAP`` after a statement the server refused, at most ``LOST_RETRY_CAP`` after a lost
connection (the pool waits for the server itself; a long wait would only delay the resume)."""

import skiplock
from skiplock.errors import ConnectionLost, DatabaseError
from skiplock.reconnect import Backoff
from skiplock.worker.aio_worker import LOST_RETRY_CAP, RETRY_CAP, AsyncWorker


def _worker():
    return AsyncWorker(skiplock.App("postgresql://nobody@127.0.0.1:1/none"), None, 2, max_connections=2)


def _backoff(failures):
    backoff = Backoff(cap=RETRY_CAP, rng=lambda low, high: high)  # always the most it may wait
    backoff.failures = failures
    return backoff


def test_a_refused_claim_backs_off_doubling_up_to_the_cap():
    worker = _worker()
    delays = [worker._failed(_backoff(n), "claim failed", DatabaseError("refused")) for n in range(10)]
    assert delays[:3] == [0.25, 0.5, 1.0]
    assert max(delays) == RETRY_CAP


def test_a_lost_connection_waits_at_most_the_lost_cap():
    worker = _worker()
    delays = [worker._failed(_backoff(n), "claim failed", ConnectionLost("gone")) for n in range(10)]
    assert delays[:2] == [0.25, 0.5]
    assert max(delays) == LOST_RETRY_CAP < RETRY_CAP
