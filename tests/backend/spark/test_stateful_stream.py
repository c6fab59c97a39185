"""A stateful step composes like a DataFrame transformation and starts with Spark's writeStream shape."""

from __future__ import annotations

import json
import os

import pytest
from pyspark.sql import functions as F

from dstl.backend.spark import StatefulProcessor, stateful_stream
from dstl.spi import ConfigError
from tests.backend.spark.test_query import local_config


class Count(StatefulProcessor):
    """A running count per user."""

    key_column = "user"

    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        count = (self.count.value() or 0) + len(rows)
        self.count.update(count)
        return [{self.key_column: key, "count": count}]


class RegionCount(Count):
    """A running count per region."""

    key_column = "region"


def write(directory, index, users):
    """One input file; the file source takes files in modification-time order."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{index:03d}.json"
    path.write_text("".join(json.dumps({"user": u}) + "\n" for u in users))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def counts(spark, tmp_path):
    return stateful_stream(
        spark.readStream.schema("user string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in")),
        key_columns=["user"],
        processor=Count,
        output_schema="user string, count long",
        config=local_config(tmp_path),
    )


def test_per_row_steps_follow_the_step_and_the_memory_sink_serves_the_rows(spark, tmp_path):
    write(tmp_path / "in", 0, ["a", "b", "a"])
    write(tmp_path / "in", 1, ["a", "c"])
    stream = counts(spark, tmp_path).where("count >= 2").withColumn("twice", F.col("count") * 2).drop("count")
    assert stream.columns == ["user", "twice"]  # known at the call
    query = (
        stream.writeStream.format("memory")
        .queryName("repeat_users")
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    rows = sorted(tuple(row) for row in spark.sql("select * from repeat_users").collect())
    assert rows == [("a", 4), ("a", 6)]  # batch 0: a=2; batch 1: a=3 (c=1 filtered out)
    assert query.completed_batches == 2


def test_a_file_format_writes_each_batch_once_and_console_prints_as_spark(spark, tmp_path, capsys):
    write(tmp_path / "in", 0, ["a", "b"])
    query = (
        counts(spark, tmp_path)
        .select("user")
        .writeStream.format("json")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start(str(tmp_path / "out"))
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    written = spark.read.json(str(tmp_path / "out"))  # Spark's layout: the rows, no extra column
    assert written.columns == ["user"] and sorted(row.user for row in written.collect()) == ["a", "b"]
    query = (
        counts(spark, tmp_path)
        .writeStream.format("console")
        .option("checkpointLocation", str(tmp_path / "chk-console"))
        .trigger(availableNow=True)
        .start()
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    printed = capsys.readouterr().out
    assert "Batch: 0" in printed and "|user|count|" in printed


def test_what_cannot_follow_or_start_is_refused_at_the_call(spark, tmp_path):
    (tmp_path / "in").mkdir()
    stream = counts(spark, tmp_path)
    with pytest.raises(ConfigError, match=r"join\(\) after a dstl stateful step is not supported"):
        stream.join(stream, "user")
    with pytest.raises(ConfigError, match=r"key columns \['region'\] are not in"):
        stateful_stream(stream, key_columns=["region"], processor=Count, output_schema="user string, n long")
    with pytest.raises(ConfigError, match="takes column names"):
        stream.groupBy(F.window("at", "1 minute"))
    with pytest.raises(ConfigError, match="mapping of column to function"):
        stream.groupBy("user").agg(F.sum("count"))
    with pytest.raises(ConfigError, match="needs a numeric column"):
        stream.groupBy("count").sum("user")
    with pytest.raises(ConfigError, match="one of"):
        stream.groupBy("user").agg({"count": "median"})
    per_user = stream.groupBy("user").count()
    with pytest.raises(ConfigError, match="append output mode needs the query's event time"):
        per_user.writeStream.option("checkpointLocation", str(tmp_path / "c")).start(str(tmp_path / "o"))
    with pytest.raises(Exception, match="nope"):  # Spark's own analysis error, at the call
        stream.select("nope")
    with pytest.raises(ConfigError, match="outputMode"):
        stream.writeStream.outputMode("complete")
    with pytest.raises(ConfigError, match="outputMode"):
        per_user.writeStream.outputMode("complete")
    with pytest.raises(ConfigError, match="checkpointLocation"):
        stream.writeStream.format("noop").start()
    with pytest.raises(ConfigError, match="needs a queryName"):
        stream.writeStream.format("memory").option("checkpointLocation", str(tmp_path / "c")).start()
    with pytest.raises(ConfigError, match="not one dstl writes"):
        stream.writeStream.format("socket").option("checkpointLocation", str(tmp_path / "c")).start("x")
    assert not any(spark.streams.active)


def test_a_replayed_batch_replaces_the_files_it_published(spark, tmp_path):
    from dstl.backend.spark._private.stream_sinks import batch_writer

    out = tmp_path / "out"
    writer = batch_writer("parquet", {}, str(out), None, spark)
    writer(spark.createDataFrame([("a",), ("b",)], "user string"), 3)
    writer(spark.createDataFrame([("a",), ("b",)], "user string"), 3)  # the same batch again, after a crash
    writer(spark.createDataFrame([("c",)], "user string"), 4)
    assert sorted(row.user for row in spark.read.parquet(str(out)).collect()) == ["a", "b", "c"]
    assert not list((out / "_dstl_staging").glob("batch_id=*"))  # nothing left staged


class Purchases(StatefulProcessor):
    """Each purchase again, with the user's running number of purchases."""

    def init(self, context):
        self.seen = context.get_value_state("seen")

    def handle_input_rows(self, key, rows):
        seen = self.seen.value() or 0
        self.seen.update(seen + len(rows))
        return [
            {
                "user": key,
                "region": region,
                "amount": None if amount != amount else int(amount),
                "n": seen + i + 1,
            }
            for i, (region, amount) in enumerate(zip(rows["region"], rows["amount"], strict=True))
        ]


def write_purchases(directory, index, purchases):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{index:03d}.json"
    lines = (json.dumps({"user": u, "region": r, "amount": a}) for u, r, a in purchases)
    path.write_text("".join(line + "\n" for line in lines))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def purchases(spark, tmp_path):
    source = spark.readStream.schema("user string, region string, amount int").option("maxFilesPerTrigger", 1)
    return stateful_stream(
        source.json(str(tmp_path / "in")),
        key_columns=["user"],
        processor=Purchases,
        output_schema="user string, region string, amount int, n long",
        config=local_config(tmp_path),
    )


def run_batches(stream, tmp_path, into, mode="update"):
    def keep(frame, batch_id):
        into[batch_id] = sorted(tuple(row) for row in frame.collect())

    query = (
        stream.writeStream.foreachBatch(keep)
        .outputMode(mode)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    return query


def test_an_aggregation_in_update_mode_emits_the_groups_each_batch_changed_with_spark_null_rules(
    spark, tmp_path
):
    write_purchases(tmp_path / "in", 0, [("a", "eu", 10), ("b", "eu", None), ("c", "us", 4)])
    write_purchases(tmp_path / "in", 1, [("a", "eu", 30), ("d", "asia", None)])
    per_region = purchases(spark, tmp_path).groupBy("region").agg({"amount": "avg", "n": "max", "*": "count"})
    assert per_region.columns == ["region", "avg(amount)", "max(n)", "count"]  # Spark's names, at the call
    out: dict = {}
    run_batches(per_region, tmp_path, out)
    assert out == {
        0: [("eu", 10.0, 1, 2), ("us", 4.0, 1, 1)],  # avg skips the null amount, count does not
        1: [("asia", None, 1, 1), ("eu", 20.0, 2, 3)],  # only the groups batch 1 changed
    }
    totals = purchases(spark, tmp_path).groupBy("region").sum("amount")
    assert totals.schema["sum(amount)"].dataType.simpleString() == "bigint"  # as Spark types a sum of ints


def test_two_stateful_steps_run_in_one_query_each_with_its_own_state_across_a_restart(spark, tmp_path):
    """The second step reads the first's output in the same batch; both continue after a restart."""
    write_purchases(tmp_path / "in", 0, [("a", "eu", 1), ("b", "eu", 2), ("a", "us", 3)])
    regions = stateful_stream(
        purchases(spark, tmp_path).where("n >= 1").select("region", "user"),
        key_columns=["region"],
        processor=RegionCount,
        output_schema="region string, count long",
        config=local_config(tmp_path),
    )
    out: dict = {}
    query = run_batches(regions, tmp_path, out)
    operators = query.lastProgress["stateOperators"]
    assert [op["numRowsTotal"] for op in operators] == [2, 2]  # users a, b; regions eu, us
    assert query.lastProgress["sink"]["numOutputRows"] == 2
    write_purchases(tmp_path / "in", 1, [("b", "us", 5)])
    run_batches(regions, tmp_path, out)  # a new query on the same location: both states restored
    assert out == {0: [("eu", 2), ("us", 1)], 1: [("us", 2)]}
    assert (tmp_path / "chk" / "dstl-steps" / "1").is_dir()  # the second step's own location
    third = stateful_stream(
        regions, key_columns=["region"], processor=RegionCount, output_schema="region string, count long"
    )
    with pytest.raises(ConfigError, match="stateful step 3 of the query is new"):
        run_batches(third, tmp_path, out)
