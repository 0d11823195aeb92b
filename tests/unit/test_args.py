"""Job arguments are checked before any SQL is sent: a rejected job writes nothing."""

import pytest

from skiplock.app import serialise_args
from skiplock.errors import InvalidJob


def test_plain_objects_serialise_compactly():
    assert serialise_args({"to": "a@example.com", "n": [1, 2]}, 1000) == '{"to":"a@example.com","n":[1,2]}'
    assert serialise_args(None, 10) == "{}"


@pytest.mark.parametrize(
    "args, message",
    [
        ([1, 2], "must be a JSON object"),
        ({1: "x"}, "keys must be strings"),
        ({"x": float("nan")}, "NaN"),
        ({"x": float("inf")}, "NaN and Infinity"),
        ({"x": {1, 2}}, "not JSON-serialisable"),
        ({"x": object()}, "not JSON-serialisable"),
        ({"x": "a\x00b"}, "NUL"),
        ({"k\x00": 1}, "NUL"),
        ({"x": "y" * 2000}, "limit is 1,000"),
    ],
)
def test_bad_args_are_rejected_with_a_reason(args, message):
    with pytest.raises(InvalidJob, match=message):
        serialise_args(args, 1000)


def test_escaped_backslash_u0000_text_is_not_a_nul():
    # the characters backslash-u-0-0-0-0 are fine; only a real NUL is refused
    assert "\\\\u0000" in serialise_args({"x": "\\u0000"}, 100)
