"""The .sql loader's fragments (backend/postgres/queries.py): a ``-- fragment: x`` block is SQL text
that statements include with a line ``-- include: x``; the server gets the statement with it in place."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from skiplock.backend.postgres import queries
from skiplock.backend.postgres.queries import load_queries

TEXT = """
-- name: first
SELECT 1,
-- include: cols
  FROM t;

-- fragment: cols
-- a comment of the fragment's, for readers
       2, {schema}.f(3)

-- name: second
-- include: cols
"""


def test_an_included_fragment_takes_the_include_lines_place():
    statements, fragments = queries._blocks(TEXT)
    assert set(statements) == {"first", "second"} and set(fragments) == {"cols"}
    first = queries._include(statements["first"], fragments, "first")
    code = [line for line in first.splitlines() if line.strip() and not line.lstrip().startswith("--")]
    assert code == ["SELECT 1,", "       2, {schema}.f(3)", "  FROM t;"]


def test_an_unknown_include_or_a_name_defined_twice_is_an_error():
    statements, fragments = queries._blocks(TEXT)
    with pytest.raises(ValueError, match="includes 'nope'"):
        queries._include("-- include: nope\n", fragments, "first")
    with pytest.raises(ValueError, match="defined twice"):
        queries._blocks(TEXT + "\n-- fragment: first\nSELECT 2\n")


def test_the_shipped_statements_have_every_include_resolved_and_every_fragment_used():
    text = resources.files("skiplock.backend.postgres").joinpath("queries.sql").read_text(encoding="utf-8")
    statements, fragments = queries._blocks(text)
    assert fragments, "queries.sql defines fragments (the flow claims share theirs)"
    used = {name for body in statements.values() for name in re.findall(r"^-- include: (\w+)\s*$", body, re.M)}
    assert used == set(fragments)
    loaded = load_queries("skiplock")
    assert set(loaded) == set(statements)  # a fragment is not a statement
    for name in ("claim_flow", "claim_flow_fair", "claim_flow_fair_many"):
        assert "include:" not in loaded[name] and "WITH lt AS MATERIALIZED" in loaded[name]
    keys = "j.partition\n  FROM j LEFT JOIN lt ON lt.task = j.task LEFT JOIN ql ON ql.queue = j.queue)"
    assert keys in loaded["claim_flow"] and keys in loaded["claim_flow_fair"]
    assert "j.partition\n     , j.step\n  FROM j LEFT JOIN lt" in loaded["claim_flow_fair_many"]
    slots = "FROM k LEFT JOIN s ts ON ts.key = k.task_key LEFT JOIN s qs ON qs.key = k.queue_key\n;"
    for name in ("claim_flow", "claim_flow_of_queue", "claim_flow_fair", "claim_flow_fair_many"):
        assert loaded[name].rstrip().endswith(slots), name  # the slots, in the claim's own statement
