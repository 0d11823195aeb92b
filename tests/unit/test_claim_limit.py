"""A claim's LIMIT as PostgreSQL gets it (``with_limit`` in backend/postgres/queries.py): a literal
for the worker's claim sizes (powers of two), so a prepared claim keeps one plan; the parameter
otherwise."""

from __future__ import annotations

import pytest

from skiplock.backend.postgres.queries import MAX_LITERAL_LIMIT, load_queries, with_limit

CLAIMS = ["claim", "claim_of_queues", "claim_any_queue", "claim_tasks", "claim_tasks_of_queues",
          "claim_tasks_any_queue"]


@pytest.mark.parametrize("name", CLAIMS)
@pytest.mark.parametrize("limit", [1, 2, 32, MAX_LITERAL_LIMIT])
def test_a_power_of_two_is_written_as_a_literal(name, limit):
    q = load_queries("skiplock")[name]
    bound = with_limit(q, limit)
    assert "%(limit)s" not in bound and f"LIMIT {limit}\n" in bound
    assert bound == q.replace("LIMIT %(limit)s", f"LIMIT {limit}")


@pytest.mark.parametrize("limit", [3, 50, 0, -4, 2 * MAX_LITERAL_LIMIT, True, 4.0, "8"])
def test_any_other_limit_stays_a_parameter(limit):
    q = load_queries("skiplock")["claim_tasks"]
    assert with_limit(q, limit) is q


def test_a_statement_without_exactly_one_limit_placeholder_is_refused():
    with pytest.raises(ValueError, match="exactly one"):
        with_limit("SELECT 1", 4)
    with pytest.raises(ValueError, match="exactly one"):
        with_limit("SELECT 1 LIMIT %(limit)s UNION ALL SELECT 2 LIMIT %(limit)s", 4)
