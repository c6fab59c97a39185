"""Key groups computed in Python equal Spark SQL's pmod(xxhash64(...), n), on real PySpark."""

import itertools
import sys

import pytest

from dstl.backend.keygroups import (
    key_group_for,
    key_group_range_for_instance,
    key_groups_for,
    key_groups_trusting,
    spark_key_group_expr,
    spark_xxhash64,
)

KEYS = ["", "a", "user-42", "ünïcødé ✓", "x" * 300]
INTS = [0, 1, -1, 42, 2**31, -(2**31) - 1, 2**62, -(2**63), 2**63 - 1]


def test_strings_ints_and_composites_agree_with_spark(spark):
    from pyspark.sql import types as T

    rows = [(s, i, float(i) / 3) for s in KEYS for i in INTS]
    schema = T.StructType(
        [
            T.StructField("s", T.StringType()),
            T.StructField("i", T.LongType()),
            T.StructField("d", T.DoubleType()),
        ]
    )
    df = spark.createDataFrame(rows, schema)
    result = df.selectExpr(
        "s",
        "i",
        "d",
        "xxhash64(s) AS hs",
        "xxhash64(i) AS hi",
        "xxhash64(d) AS hd",
        "xxhash64(s, i) AS hsi",
        f"{spark_key_group_expr(['s', 'i'], 128)} AS kg",
    ).collect()
    assert len(result) == len(rows)
    for row in result:
        assert row.hs == spark_xxhash64(row.s)
        assert row.hi == spark_xxhash64(row.i)
        assert row.hd == spark_xxhash64(row.d)
        assert row.hsi == spark_xxhash64((row.s, row.i))
        assert row.kg == key_group_for((row.s, row.i), 128)


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 1000])
def test_bulk_key_groups_of_strings_and_longs_agree_with_spark(spark, max_parallelism):
    """The bulk path hashes str and int keys without the per-type dispatch: still Spark's key groups."""
    rows = [(s, i) for s in KEYS for i in INTS]
    df = spark.createDataFrame(rows, "s string, i long")
    result = df.selectExpr(
        "s", "i", f"pmod(xxhash64(s), {max_parallelism}) AS ks", f"pmod(xxhash64(i), {max_parallelism}) AS ki"
    ).collect()
    assert key_groups_for([row.s for row in result], max_parallelism) == [row.ks for row in result]
    assert key_groups_for([row.i for row in result], max_parallelism) == [row.ki for row in result]


def test_bulk_key_groups_of_other_keys_are_each_keys_and_refuse_what_it_refuses():
    keys = ["a", 3, -(2**63), 2.5, -0.0, None, True, False, b"raw", ("a", 1), ("x", None, 2.0)]
    assert key_groups_for(keys, 1000) == [key_group_for(key, 1000) for key in keys]
    assert key_groups_for([], 128) == []
    with pytest.raises(ValueError, match="64-bit"):
        key_groups_for(["a", 2**63])
    with pytest.raises(TypeError, match="cannot hash a key of type dict"):
        key_groups_for([1, {"a": 1}])
    with pytest.raises(ValueError, match="at least 1"):
        key_groups_for(["a"], 0)


def test_given_key_groups_stand_only_for_string_and_long_keys_whose_sample_agrees():
    keys = [f"user-{i}" for i in range(1000)] + list(range(1000))
    own = key_groups_for(keys, 128)
    assert key_groups_trusting(keys, own, 128) == tuple(own)
    assert all(type(group) is int for group in key_groups_trusting(keys, own, 128))
    wrong = [
        key_groups_for(keys, 64),  # hashed for another max parallelism
        own[1:] + own[:1],  # a column shifted by a row
        [group + 1 for group in own],
        own[:-1],  # one short
    ]
    for given in wrong:
        assert key_groups_trusting(keys, given, 128) == tuple(own)
    # a float's, a tuple's or a None's hash may differ by value: hashed here, whatever is given
    others = [0.5, -0.0, ("a", 1), None, True]
    assert key_groups_trusting(others, [0] * len(others), 128) == tuple(key_groups_for(others, 128))
    assert key_groups_trusting(keys, None, 128) == tuple(own)
    assert key_groups_trusting([], [], 128) == ()


def test_booleans_and_nulls_agree_with_spark(spark):
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("b", T.BooleanType()), T.StructField("s", T.StringType())])
    df = spark.createDataFrame([(True, "k"), (False, None), (None, "k")], schema)
    for row in df.selectExpr("b", "s", "xxhash64(b, s) AS h").collect():
        assert row.h == spark_xxhash64((row.b, row.s))


def test_key_group_is_stable_across_processes():
    import subprocess

    code = "from dstl.backend.keygroups import key_group_for; print(key_group_for(('user-7', 3), 128))"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(3)
    }
    assert len(outputs) == 1 and outputs.pop().strip() == str(key_group_for(("user-7", 3), 128))


def test_ranges_split_key_groups_contiguously_and_completely():
    for parallelism in (1, 2, 3, 4, 7, 8, 128):
        ranges = [key_group_range_for_instance(i, parallelism, 128) for i in range(parallelism)]
        assert ranges[0].start == 0 and ranges[-1].end == 128
        assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
        assert all(len(r) >= 1 for r in ranges)


def test_bad_keys_and_parameters():
    with pytest.raises(TypeError, match="cannot hash a key of type dict"):
        key_group_for({"a": 1})
    with pytest.raises(ValueError, match="64-bit"):
        key_group_for(2**64)
    with pytest.raises(ValueError):
        key_group_range_for_instance(0, 200, 128)
    with pytest.raises(ValueError):
        key_group_for("a", 0)
