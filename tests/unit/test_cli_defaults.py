"""Defaults the command line writes out (so that ``skiplock --help`` need not import the worker)
agree with the library's."""

from skiplock.cli import worker as cli_worker
from skiplock.worker.batching import DEFAULT_BATCH_SIZE


def test_worker_batch_size_default_is_the_libraries():
    assert cli_worker.DEFAULT_BATCH_SIZE == DEFAULT_BATCH_SIZE


def test_worker_batch_wait_default_is_the_libraries():
    from skiplock.worker.batching import DEFAULT_BATCH_WAIT

    assert cli_worker.DEFAULT_BATCH_WAIT == DEFAULT_BATCH_WAIT


def test_worker_flow_turns_are_the_libraries():
    from skiplock.worker.batching import FLOW_TURNS

    assert cli_worker.FLOW_TURNS == FLOW_TURNS


def test_worker_batch_budget_default_is_the_libraries():
    from skiplock.worker.batching import DEFAULT_BATCH_BUDGET, BatchPolicy

    assert cli_worker.DEFAULT_BATCH_BUDGET == DEFAULT_BATCH_BUDGET == BatchPolicy().batch_budget
