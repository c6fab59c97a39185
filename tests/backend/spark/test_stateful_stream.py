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

    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        count = (self.count.value() or 0) + len(rows)
        self.count.update(count)
        return [{"user": key, "count": count}]


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
    with pytest.raises(ConfigError, match=r"groupBy\(\) after a dstl stateful step is not supported"):
        stream.groupBy("user")
    with pytest.raises(ConfigError, match="one dstl stateful step per query"):
        stateful_stream(stream, key_columns=["user"], processor=Count, output_schema="user string, n long")
    with pytest.raises(Exception, match="nope"):  # Spark's own analysis error, at the call
        stream.select("nope")
    with pytest.raises(ConfigError, match="outputMode"):
        stream.writeStream.outputMode("complete")
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
