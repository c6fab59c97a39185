"""Grouping an instance's rows once (sort + offsets), and a processor's output in any form as columns."""

import datetime as dt
import math

import pandas as pd
import pyarrow as pa
import pytest

from dstl.backend.spark._private.instance_rows import ArrowRows
from dstl.backend.spark._private.output import output_columns
from dstl.backend.spark.batch import KeyedBatch
from dstl.backend.spark.processor import TouchedKeys


def test_rows_are_grouped_by_key_in_first_seen_order_with_offsets():
    frame = pd.DataFrame({"user": ["b", "a", "b", None, "c", "a", None], "n": [1, 2, 3, 4, 5, 6, 7]})
    batch = KeyedBatch.of(frame, ["user"])
    assert batch.keys == ["b", "a", None, "c"]
    assert batch.offsets.tolist() == [0, 2, 4, 6, 7]
    assert batch.counts().tolist() == [2, 2, 2, 1]
    assert [(key, rows["n"].tolist()) for key, rows in batch.per_key()] == [
        ("b", [1, 3]),
        ("a", [2, 6]),
        (None, [4, 7]),
        ("c", [5]),
    ]
    assert batch.rows_of(1)["n"].tolist() == [2, 6]
    assert batch.column("n").tolist() == [1, 3, 2, 6, 4, 7, 5]


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(["b", "a", None, "b", "ü", None, "a"], dtype=object),  # strings and nulls (Arrow)
        pd.Series([3, -1, 3, 2**40, -1]),  # longs (Arrow)
        pd.Series([3, None, 3, 7], dtype="Int64"),  # nullable longs (Arrow)
        pd.Series([1, "1", 1, "1"], dtype=object),  # mixed: pandas groups them
        pd.Series([b"x", b"y", b"x"], dtype=object),  # bytes: pandas
        pd.Series([0.5, math.nan, 0.5, math.nan, -0.0, 0.0]),  # floats: pandas (-0.0 is 0.0)
        pd.Series([2**64 + 1, 5, 2**64 + 1], dtype=object),  # beyond a long: pandas
    ],
    ids=["strings", "longs", "nullable-longs", "mixed", "bytes", "floats", "huge-ints"],
)
def test_every_key_column_groups_as_pandas_groupby_does(column):
    frame = pd.DataFrame({"k": column, "i": range(len(column))})
    batch = KeyedBatch.of(frame, ["k"])
    expected = frame.groupby("k", sort=False, dropna=False)["i"].apply(list).tolist()
    assert [rows["i"].tolist() for _, rows in batch.per_key()] == expected
    firsts = [positions[0] for positions in expected]
    assert batch.first_rows.tolist() == firsts
    assert [repr(key) for key in batch.keys] == [repr(key) for key in frame["k"].iloc[firsts].tolist()]


def test_a_batch_read_by_its_keys_and_counts_never_copies_the_rows():
    frame = pd.DataFrame({"user": ["b", "a", "b"], "n": [1, 2, 3]})
    batch = KeyedBatch.of(frame, ["user"])
    assert (batch.keys, batch.counts().tolist()) == (["b", "a"], [2, 1])
    assert batch._rows is frame
    assert batch.rows["n"].tolist() == [1, 3, 2]
    assert batch.rows is batch.rows  # sorted once


@pytest.mark.parametrize(
    ("columns", "key_columns", "decoded_to_group"),
    [
        ({"k": pa.array(["b", "a", None, "b", "ü", None, "a"])}, ["k"], False),  # strings: Arrow
        ({"k": pa.array(["b", "a", "b"], pa.large_string())}, ["k"], False),
        ({"k": pa.array([3, -1, 3, 2**40, -1], pa.int64())}, ["k"], False),  # longs: Arrow
        ({"k": pa.array([3, 1, 3], pa.int8())}, ["k"], False),
        ({"k": pa.array([3, None, 3, 7], pa.int64())}, ["k"], True),  # pandas makes these floats
        ({"k": pa.array([0.5, None, 0.5, -0.0, 0.0])}, ["k"], True),
        ({"k": pa.array([b"x", b"y", b"x"])}, ["k"], True),
        ({"k": pa.array([dt.datetime(2026, 3, 29, 1, 30)] * 2, pa.timestamp("us", tz="UTC"))}, ["k"], True),
        ({"a": pa.array([1, 1, 2, 1]), "b": pa.array([1.5, 2.5, 1.5, 1.5])}, ["a", "b"], True),
    ],
    ids=[
        "strings",
        "large-strings",
        "longs",
        "bytes-ints",
        "nullable-longs",
        "floats",
        "binary",
        "timestamps",
        "two",
    ],
)
def test_arrow_rows_group_into_the_batch_their_pandas_frame_gives(
    monkeypatch, columns, key_columns, decoded_to_group
):
    rows = ArrowRows(pa.table({**columns, "i": range(len(next(iter(columns.values()))))}), "Europe/Berlin")
    expected = KeyedBatch.of(rows.frame(), key_columns)
    decoded: list[list[str]] = []
    decode = ArrowRows.frame
    monkeypatch.setattr(ArrowRows, "frame", lambda self: decoded.append(self.columns) or decode(self))
    batch = KeyedBatch.of(rows, key_columns)
    # only keys whose Python values differ from Arrow's are decoded, and only their columns
    assert decoded == ([key_columns] if decoded_to_group else [])
    assert [repr(key) for key in batch.keys] == [repr(key) for key in expected.keys]
    assert batch.offsets.tolist() == expected.offsets.tolist()
    assert batch.first_rows.tolist() == expected.first_rows.tolist()
    assert batch._rows is None, "grouping decoded every row"
    assert batch.column("i").tolist() == expected.column("i").tolist()
    assert batch._rows is None, "reading one column decoded every row"
    pd.testing.assert_frame_equal(batch.rows, expected.rows)
    assert [rows["i"].tolist() for _, rows in batch.per_key()] == [
        rows["i"].tolist() for _, rows in expected.per_key()
    ]


@pytest.mark.parametrize(
    "keys",
    [
        ["user-b", "a", "user-b", "ü", "zz", "a", "user-aa", "b", None, "c" * 40, "a"],  # lengths differ
        [3, -1, 3, 2**40, -1, 200, 70_000, 0, 127, 128],  # integers of every stored length
    ],
    ids=["strings", "longs"],
)
def test_keys_routed_with_their_key_groups_come_in_the_stores_order(tmp_path, keys):
    import msgpack
    import numpy as np

    from dstl.backend.delegate import LmdbDelegate
    from dstl.backend.keygroups import key_group_for

    groups = np.array([key_group_for(key, 4) for key in keys])
    rows = ArrowRows(pa.table({"k": keys, "i": range(len(keys))}), "UTC")
    batch = KeyedBatch.of(rows, ["k"], key_groups=groups)
    expected = KeyedBatch.of(rows, ["k"])  # first-seen order
    assert sorted(map(repr, batch.keys)) == sorted(map(repr, expected.keys))
    by_key = {repr(key): rows["i"].tolist() for key, rows in expected.per_key()}
    assert {repr(key): rows["i"].tolist() for key, rows in batch.per_key()} == by_key
    assert batch.column("i").tolist() == [i for key in batch.keys for i in by_key[repr(key)]]
    assert groups[batch.first_rows].tolist() == [key_group_for(key, 4) for key in batch.keys]

    store = LmdbDelegate(tmp_path / "lmdb", map_size=1 << 22)  # the order the working copy keeps
    raw = [msgpack.packb(key, use_bin_type=True) for key in batch.keys]
    key_groups = [key_group_for(key, 4) for key in batch.keys]
    store.put_values("v", key_groups[::-1], raw[::-1], [b"x"] * len(raw))
    stored = [key for group in sorted(set(key_groups)) for key, _ in store.entries("v", group)]
    assert raw == stored, "the batch's keys are not in the order the store keeps them"


def test_empty_arrow_rows_make_an_empty_batch():
    batch = KeyedBatch.of(ArrowRows(pa.table({"k": pa.array([], pa.string())}), "UTC"), ["k"])
    assert len(batch) == 0 and batch.rows.empty and list(batch.rows.columns) == ["k"]


def test_touched_keys_count_each_key_once():
    touched = TouchedKeys()
    assert len(touched) == 0
    touched.add_distinct(["a", "b"])
    assert len(touched) == 2
    touched.add("a")
    touched.add("c")
    assert len(touched) == 3
    touched.add_distinct(["c", "d"])
    assert len(touched) == 4


def test_keys_of_several_columns_are_tuples_of_python_values():
    frame = pd.DataFrame({"a": [1, 1, 2, 1], "b": [1.5, 2.5, 1.5, 1.5], "x": list("wxyz")})
    batch = KeyedBatch.of(frame, ["a", "b"])
    assert batch.keys == [(1, 1.5), (1, 2.5), (2, 1.5)]
    assert all(type(part) in (int, float) for key in batch.keys for part in key)
    assert [rows["x"].tolist() for _, rows in batch.per_key()] == [["w", "z"], ["x"], ["y"]]
    assert len(KeyedBatch.of(frame.iloc[:0], ["a"])) == 0


def test_nan_keys_form_one_group():
    frame = pd.DataFrame({"k": [1.0, math.nan, 2.0, math.nan]})
    batch = KeyedBatch.of(frame, ["k"])
    assert len(batch) == 3 and batch.counts().tolist() == [1, 2, 1]


@pytest.mark.parametrize(
    "result",
    [
        pd.DataFrame({"k": ["a", "b"], "n": [1, 2]}),  # extra ones are refused, as Spark does
        {"k": ["a", "b"], "n": [1, 2]},
        [{"k": "a", "n": 1}, {"k": "b", "n": 2}],
        ({"k": k, "n": n} for k, n in (("a", 1), ("b", 2))),
    ],
)
def test_every_output_form_becomes_the_same_columns(result):
    assert output_columns(result, ("k", "n")) == {"k": ["a", "b"], "n": [1, 2]}


def test_bad_output_is_a_clear_error():
    assert output_columns(None, ("k",)) == {"k": []}
    assert output_columns(pd.DataFrame(), ("k",)) == {"k": []}
    with pytest.raises(ValueError, match="without the output columns \\['n'\\]"):
        output_columns({"k": [1]}, ("k", "n"))
    with pytest.raises(ValueError, match="different lengths"):
        output_columns({"k": [1], "n": [1, 2]}, ("k", "n"))
    with pytest.raises(TypeError, match="rows must be dicts"):
        output_columns([("a", 1)], ("k", "n"))
    with pytest.raises(TypeError, match="returns a DataFrame"):
        output_columns(7, ("k",))


def test_a_batch_processor_needs_no_per_key_method_and_one_with_neither_says_so(memory_config):
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.spark import StateContext, StatefulProcessor
    from dstl.spi import KeyGroupRange, load_storage

    class Totals(StatefulProcessor):
        def init(self, context):
            self.total = context.get_value_state("total")

        def handle_batch(self, batch, context):
            sums = [int(s) for s in batch.rows.groupby(batch.column("user"), sort=False)["amount"].sum()]
            totals = [(t or 0) + s for t, s in zip(self.total.get_many(batch.key_set), sums, strict=True)]
            self.total.update_many(batch.key_set, totals)
            return {"user": batch.keys, "total": totals}

    class Nothing(StatefulProcessor):
        def init(self, context):
            pass

    frame = pd.DataFrame({"user": ["a", "b", "a"], "amount": [1, 2, 3]})
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128))
        context = StateContext(backend, 0, 0, ("user",))
        totals = Totals()
        totals.init(context)
        assert output_columns(totals.handle_input_batch(frame, context), ("user", "total")) == {
            "user": ["a", "b"],
            "total": [4, 2],
        }
        assert output_columns(totals.handle_input_batch(frame, context), ("user", "total"))["total"] == [8, 4]
        with pytest.raises(NotImplementedError, match="Nothing overrides neither"):
            Nothing().handle_input_batch(frame, context)
        backend.close()


def test_per_key_results_of_every_form_keep_their_order_and_missing_columns_are_none(memory_config):
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.spark import StateContext, StatefulProcessor
    from dstl.spi import KeyGroupRange, load_storage

    class Mixed(StatefulProcessor):
        """Frames, dict rows, nothing and empty frames, key by key."""

        def init(self, context):
            pass

        def handle_input_rows(self, key, rows):
            n = len(rows)
            if key == "a":
                return pd.DataFrame({"k": [key] * n, "n": list(range(n))})
            if key == "b":
                return [{"k": key, "extra": "x"}]
            if key == "c":
                return None
            if key == "d":
                return pd.DataFrame({"k": [], "n": []})
            return pd.DataFrame({"n": [n], "k": [key]})  # columns in another order

    frame = pd.DataFrame({"k": ["a", "b", "a", "c", "d", "e", "e"]})
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128))
        context = StateContext(backend, 0, 0, ("k",))
        columns = output_columns(Mixed().handle_input_batch(frame, context), ("k", "n", "extra"))
    assert columns == {"k": ["a", "a", "b", "e"], "n": [0, 1, None, 2], "extra": [None, None, "x", None]}
