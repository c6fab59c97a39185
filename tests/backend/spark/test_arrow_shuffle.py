"""With nothing to pin to, the JVM shuffles each instance's rows to a partition of its own."""

from __future__ import annotations

import pytest

from dstl.backend.spark._private.arrow_shuffle import (
    instance_partition_key,
    instance_shuffled,
    spark_hash_int,
    spark_partition_keys,
)
from dstl.backend.spark._private.columns import INSTANCE_COLUMN
from dstl.backend.spark._private.routing import RoutingColumns

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
        instance_shuffled(rows, parallelism, RoutingColumns(("user",), parallelism, 128).partition_key)
        .select(F.spark_partition_id().alias("p"), INSTANCE_COLUMN)
        .distinct()
        .collect()
    )
    assert sorted((row.p, row[INSTANCE_COLUMN]) for row in placed) == [(i, i) for i in range(parallelism)]


def test_a_querys_routing_columns_are_built_once_and_serve_every_batch(spark, monkeypatch):
    from pyspark.sql import functions as F

    from dstl.backend.spark._private.routing import routed

    built: list[str] = []
    expr = F.expr
    monkeypatch.setattr(F, "expr", lambda sql: built.append(sql) or expr(sql))
    routing = RoutingColumns(("user",), 2, 128)
    for batch in range(3):
        rows = spark.createDataFrame([(f"u{batch}{i}",) for i in range(20)], "user string")
        shuffled = instance_shuffled(routed(rows, routing, None), 2, routing.partition_key)
        assert {row[INSTANCE_COLUMN] for row in shuffled.collect()} <= {0, 1}
    assert sorted(built) == sorted([routing.key_group_sql, routing.instance_sql, instance_partition_key(2)])
