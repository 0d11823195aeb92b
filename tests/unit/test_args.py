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


# ---- enqueue_many's shortcut: the same jobs and the same errors as the one-by-one checks ----------

import json  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

from skiplock import App  # noqa: E402
from skiplock.app import _encode_compact, _plain_args_json  # noqa: E402

SAMPLES = [
    {}, {"a": 1}, {"to": "a@example.com", "n": [1, 2.5, None, True, False]}, {"é": "ü € 😀", "x": "\n\t\\\""},
    {"big": 10**30, "neg": -0.0, "tiny": 5e-324, "deep": {"a": {"b": [[{}]]}}}, {"s": "\\u0000 is not a NUL"},
    {"s": "y" * 90}, {"s": "é" * 60},  # 68 characters, 128 bytes as JSON: over a 100-byte limit
    {"x": float("nan")}, {"x": float("-inf")}, {"x": {1, 2}}, {"x": object()}, {"x": "a\x00b"}, {"k\x00": 1},
    {"x": "\ud800"}, {1: "x"}, {"a": 1, 2: "b"}, {True: 1}, {None: 1},
]


def test_the_compact_encoder_is_json_dumps():
    for value in SAMPLES[:8] + [[], "s", 1.0, None, [{"a": [1, {"b": "\u2028"}]}]]:
        assert _encode_compact(value) == json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def test_plain_args_json_is_serialise_args_or_defers_to_it():
    used = 0
    for args in SAMPLES:
        for limit in (1, 2, 100, 1 << 20):
            text = _plain_args_json(args, limit)
            if text is None:
                continue  # serialise_args decides
            used += 1
            assert text == serialise_args(args, limit), (args, limit)
    assert used >= 10  # and the shortcut does take the common cases


def test_a_cycle_still_gets_the_plain_error():
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert _plain_args_json(cyclic, 1 << 20) is None
    with pytest.raises(InvalidJob, match="Circular reference"):
        serialise_args(cyclic, 1 << 20)


def _app() -> App:
    app = App("dbname=unused", max_args_bytes=100)  # nothing connects

    @app.task(name="mail", queue="emails", priority=3, max_attempts=7)
    def mail(job, **kwargs):
        pass

    return app


def test_many_jobs_are_checked_exactly_as_one_by_one():
    app = _app()
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
    items = []
    for args in SAMPLES[:8]:
        for task in ("mail", "other"):
            for options in (None, {}, {"queue": "q"}, {"priority": -2, "max_attempts": 9}, {"run_at": when}):
                items.append((task, args) if options is None else (task, args, options))
    items = [item for item in items if len(json.dumps(item[1], ensure_ascii=False).encode()) <= 100] * 3
    expected = [app._new_job(t, a, *((o or {}).get(k) for k in ("queue", "priority", "run_at", "delay", "max_attempts")))
                for t, a, *rest in items for o in [rest[0] if rest else None]]
    assert app._new_jobs(items) == (expected, {})
    assert app._new_jobs([["mail", {"a": 1}], ("mail", None)]) == ([app._new_job("mail", x, None, None, None, None, None)
                                                                   for x in ({"a": 1}, None)], {})


@pytest.mark.parametrize(
    "bad, message",
    [
        (("mail", {"x": float("nan")}), "args: not valid JSON"),
        (("mail", {"x": {1}}), "not JSON-serialisable"),
        (("mail", {1: "x"}), "keys must be strings"),
        (("mail", {"x": "a\x00b"}), "NUL"),
        (("mail", {"x": "\ud800"}), "lone surrogate"),
        (("mail", {"s": "é" * 60}), "128 bytes as JSON; the limit is 100"),
        (("mail", [1]), "must be a JSON object"),
        (("mail", {}, {"priority": True}), "priority must be an integer"),
        (("mail", {}, {"priority": 1.0}), "priority must be an integer"),
        (("mail", {}, {"max_attempts": 0}), "max_attempts must be"),
        (("mail", {}, {"queue": ""}), "queue must be"),
        (("mail", {}, {"bogus": 1}), r"unknown options \['bogus'\]"),
        (("ma\x00il", {}), "task must be text without NUL"),
        (("", {}), "task must be a non-empty string"),
        (("mail",), "expected \\(task, args\\)"),
        (("mail", {}, {"unique_key": ""}), "unique_key must be a non-empty string"),
        (("mail", {}, {"unique_key": 42}), "unique_key must be a non-empty string"),
        (("mail", {}, {"unique_key": "a\x00b"}), "unique_key must be .* without NUL"),
        (("mail", {}, {"unique_key": "k" * 1001}), "at most 1000 characters"),
        (("mail", {}, {"unique_key": "k", "on_conflict": "ignore"}), "on_conflict must be 'return' or 'raise'"),
        (("mail", {}, {"on_conflict": None}), "on_conflict must be 'return' or 'raise'"),
    ],
)
def test_a_bad_item_after_good_ones_is_named_by_its_index(bad, message):
    app = _app()
    # the good items warm the shortcut for "mail" (also with priority 1 and True == 1 == 1.0)
    good = [("mail", {"a": 1}), ("mail", {}, {"priority": 1}), ("mail", {}, {"max_attempts": 1}), ("mail", {})]
    with pytest.raises(InvalidJob, match=f"^item 4: .*{message}"):
        app._new_jobs(good + [bad] + good)


# ---- unique keys in enqueue_many: checked per item, and the batch's bookkeeping (no database) ---------

from skiplock.backend.postgres.backend import PostgresBackend
from skiplock.backend.postgres.producing import HolderGone, KeyedBatch  # noqa: E402
from skiplock.errors import DuplicateJob  # noqa: E402


def test_unique_options_are_collected_by_item_index_and_do_not_change_the_jobs():
    app = _app()
    items = [("mail", {"a": 1}), ("mail", {"a": 2}, {"unique_key": "k1"}), ("mail", {"a": 3}, {"priority": 1}),
             ("mail", {"a": 4}, {"unique_key": "k2", "on_conflict": "raise", "queue": "q"}),
             ("mail", {"a": 5}, {"on_conflict": "raise"})]  # on_conflict without a key: checked, no effect
    jobs, keyed = app._new_jobs(items)
    assert keyed == {1: ("k1", "return"), 3: ("k2", "raise")}
    plain = [(t, a, {k: v for k, v in (o[0] if o else {}).items() if k not in ("unique_key", "on_conflict")})
             for t, a, *o in items]
    assert jobs == app._new_jobs(plain)[0]


def _batch(keys: list, on_conflict: dict | None = None) -> KeyedBatch:
    app = _app()
    jobs, keyed = app._new_jobs([("mail", {"i": i}, {} if k is None else
                                  {"unique_key": k, "on_conflict": (on_conflict or {}).get(i, "return")})
                                 for i, k in enumerate(keys)])
    return KeyedBatch(jobs, keyed)


BACKEND = PostgresBackend("dbname=unused")  # nothing connects


def test_a_key_is_sent_once_and_later_items_get_the_first_ones_id():
    batch = _batch(["a", None, "a", "b", "a"])
    assert batch.sent == [0, 1, 3]
    _, params = batch.insert(BACKEND)
    assert params["unique_keys"] == ["a", None, "b"] and [a for a in params["args"]] == ['{"i":0}', '{"i":1}', '{"i":3}']
    assert batch.inserted(BACKEND, [(True, 10), (True, 11), (False, 5)]) is None
    assert batch.ids() == [10, 11, 10, 5, 10]


def test_a_later_duplicate_with_raise_is_refused_before_anything_is_sent():
    with pytest.raises(DuplicateJob, match="item 2: unique_key 'a' is also item 0's") as info:
        _batch(["a", "b", "a"], {2: "raise"})
    assert info.value.existing_id is None
    assert _batch(["a", "a"], {0: "raise"}).same_as == {1: 0}  # the first may raise: it is the one sent


def test_holders_missing_from_the_snapshot_are_looked_up_then_retried_if_gone():
    batch = _batch(["a", "b", "c"])
    query, params = batch.inserted(BACKEND, [(True, 10), (False, None), (False, None)])
    assert query == BACKEND.q["unique_key_holders"] and params == {"unique_keys": ["b", "c"]}
    batch.looked_up([("b", 3)])
    with pytest.raises(HolderGone):  # c's holder finished before we could read it: undo, again
        batch.ids()
    batch.inserted(BACKEND, [(True, 12), (False, 3), (True, 13)])  # the next attempt
    assert batch.ids() == [12, 3, 13]


def test_the_first_raise_item_that_met_a_holder_is_refused_naming_it():
    batch = _batch(["a", "b", "c", "d"], {1: "raise", 3: "raise"})
    batch.inserted(BACKEND, [(False, 7), (True, 20), (False, 8), (False, 9)])
    with pytest.raises(DuplicateJob, match="item 3: job 9 already holds unique_key 'd'") as info:
        batch.ids()
    assert info.value.existing_id == 9
