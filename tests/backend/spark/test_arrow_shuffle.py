"""With nothing to pin to, the JVM shuffles each instance's rows to a partition of its own."""

from __future__ import annotations

import pytest

from dstl.backend.spark._private.arrow_shuffle import instance_shuffled, spark_hash_int, spark_partition_keys
from dstl.backend.spark._private.columns import INSTANCE_COLUMN

INTS = [0, 1, -1, 2, 42, 1000, 2**31 - 1, -(2**31), 123_456_789, -987_654_321]


def test_the_hash_of_an_int_is_sparks(spark):
    rows = spark.createDataFrame([(v,) for v in INTS], "v int").selectExpr("v", "hash(v) AS h").collect()
    assert [spark_hash_int(row.v) for row in rows] == [row.h for row in rows]


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 128])
def test_each_partition_has_a_key_spark_hashes_to_it(spark, partitions):
    keys = spark_partition_keys(partitions)
    assert len(keys) == partitions
    got = spark.createDataFrame([(k,) for k in keys], "k int").selectExpr(f"pmod(hash(k), {partitions}) AS p")
    assert [row.p for row in got.collect()] == list(range(partitions))


@pytest.mark.parametrize("parallelism", [2, 3, 5])
def test_instance_i_rows_are_all_in_partition_i_and_alone_there(spark, parallelism):
    from pyspark.sql import functions as F

    rows = spark.createDataFrame(
        [(f"u{i}", i % parallelism) for i in range(300)], f"user string, {INSTANCE_COLUMN} int"
    ).repartition(4)
    placed = (
        instance_shuffled(rows, parallelism)
        .select(F.spark_partition_id().alias("p"), INSTANCE_COLUMN)
        .distinct()
        .collect()
    )
    assert sorted((row.p, row[INSTANCE_COLUMN]) for row in placed) == [(i, i) for i in range(parallelism)]
