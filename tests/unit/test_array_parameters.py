"""The text parameters a batch's bookkeeping sends instead of psycopg's list dumpers
(``int_array``, ``json_array``, ``text_array`` in backend/postgres/queries.py; ``start_batch``,
``complete_batch`` and the claims of a worker's tasks in queries.sql)."""

import json

import pytest

from skiplock.backend.postgres.queries import int_array, json_array, text_array


def test_int_array_is_a_postgres_array_literal():
    assert int_array([1, 22, 9_223_372_036_854_775_807, -3]) == "{1,22,9223372036854775807,-3}"
    assert int_array([]) == "{}"


@pytest.mark.parametrize("bad", [True, 1.0, "1", None, "1}; DROP TABLE jobs; --"])
def test_int_array_refuses_anything_but_ints(bad):
    with pytest.raises(TypeError, match="not an int"):
        int_array([1, bad])


def test_json_array_keeps_each_result_and_none_as_null():
    results = ['{"a":[1,"x,]"]}', None, '"\\"quoted\\" \\\\ é 😀"', "0", "[]"]
    assert json.loads(json_array(results)) == [{"a": [1, "x,]"]}, None, '"quoted" \\ é 😀', 0, []]
    assert json_array([]) == "[]"


def test_text_array_quotes_every_element_by_the_array_syntax():
    assert text_array(("a", 'say "hi"', "back\\slash", "{x,y}", "")) == \
        '{"a","say \\"hi\\"","back\\\\slash","{x,y}",""}'
    assert text_array(()) == "{}"


@pytest.mark.parametrize("bad", [None, 1, b"bytes"])
def test_text_array_refuses_anything_but_str(bad):
    with pytest.raises(TypeError, match="not a str"):
        text_array(("ok", bad))
