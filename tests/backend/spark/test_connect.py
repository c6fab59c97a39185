"""Spark Connect: the user's unchanged processor and query run on a Connect session as on Spark's engine.

A local Connect server (a child process, ``spark_connect``) runs the query; the
client pickles dstl's ``foreachBatch`` function, whose runner is built on the
server, and learns of each batch from Spark's progress and dstl's progress records.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pandas as pd
import pytest

from dstl.backend.spark import read_state, transform_with_state
from dstl.spi import ConfigError

pyspark_api = pytest.importorskip("pyspark.sql.streaming.stateful_processor")

OUTPUT = "user string, count long"


class RunningCount(pyspark_api.StatefulProcessor):
    """Spark's running count per user, written for transformWithStateInPandas."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        stored = self.count.get()
        count = (stored[0] if stored else 0) + sum(len(frame) for frame in rows)
        self.count.update((count,))
        yield pd.DataFrame({"user": [key[0]], "count": [count]})

    def close(self):
        pass


BATCHES = [["a", "b", "a"], ["b", "c"], ["a", "c", "c", "d"]]
#: each batch's running counts of the users it saw
EXPECTED = [
    {("a", 2), ("b", 1)},
    {("b", 2), ("c", 1)},
    {("a", 3), ("c", 3), ("d", 1)},
]


def write_batch(directory: Path, index: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".part-{index}.tmp"
    temporary.write_text("".join(json.dumps({"user": user}) + "\n" for user in BATCHES[index]))
    os.utime(temporary, (1_700_000_000 + index, 1_700_000_000 + index))
    temporary.rename(directory / f"part-{index:03d}.json")


def batches_written(directory: Path) -> list[set[tuple[str, int]]]:
    """What a per-batch sink wrote (``batch_id=N`` directories), batch by batch."""
    found = sorted(directory.glob("batch_id=*"), key=lambda path: int(path.name.split("=")[1]))
    return [{(row.user, int(row.count)) for row in pd.read_parquet(path).itertuples()} for path in found]


def sparks_sink(path: str):
    def write(frame, batch_id):  # runs on the Connect server, as dstl's does
        frame.write.mode("overwrite").parquet(f"{path}/batch_id={batch_id}")

    return write


def test_sparks_engine_on_the_connect_session(spark_connect, tmp_path):
    """The specification: transformWithStateInPandas on the same Connect session."""
    frame = spark_connect.readStream.schema("user string").json(str(tmp_path / "in"))
    write_batch(tmp_path / "in", 0)
    query = (
        frame.groupBy("user")
        .transformWithStateInPandas(
            statefulProcessor=RunningCount(), outputStructType=OUTPUT, outputMode="Update", timeMode="None"
        )
        .writeStream.foreachBatch(sparks_sink(str(tmp_path / "out")))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        for index in range(len(BATCHES)):
            if index:
                write_batch(tmp_path / "in", index)
            query.processAllAvailable()
    finally:
        query.stop()
    assert batches_written(tmp_path / "out") == EXPECTED


def test_the_users_processor_and_query_run_on_connect_across_a_restart(spark_connect, tmp_path, caplog):
    config = {"dstl.storage": "local", "dstl.spark.working-dir": str(tmp_path / "working")}

    def start():
        return transform_with_state(
            spark_connect.readStream.schema("user string").json(str(tmp_path / "in")),
            key_columns=["user"],
            processor=RunningCount(),
            output_schema=OUTPUT,
            sink=str(tmp_path / "out"),
            checkpoint_location=str(tmp_path / "chk"),
            config=config,
        )

    write_batch(tmp_path / "in", 0)
    with caplog.at_level(logging.WARNING, logger="dstl.backend.spark"):
        query = start()
    assert "Spark Connect: dstl.spark.placement=sticky needs the driver's JVM gateway" in caplog.text
    try:
        query.process_all_available()
        write_batch(tmp_path / "in", 1)
        query.process_all_available()
        assert query.completed_batches == 2
        progress = query.last_progress
        assert progress is not None and progress["batchId"] == 1
        (operator,) = progress["stateOperators"]
        assert operator["operatorName"] == "dstlTransformWithState"
        assert operator["numRowsTotal"] == 3  # a, b, c: one count each
        assert progress["sink"]["numOutputRows"] == 2
        assert [p.batch_id for p in query.progress] == [0, 1]
    finally:
        query.stop()
    write_batch(tmp_path / "in", 2)
    query = start()  # a new run continues from the checkpoint the server completed
    try:
        query.process_all_available()
        assert query.wait_for_batches(1, timeout=60), query.exception()
        latest = query.latest_checkpoint()
        assert latest is not None and latest.checkpoint_id == 2
    finally:
        query.stop()
    assert batches_written(tmp_path / "out") == EXPECTED


def test_what_cannot_run_on_connect_is_refused_at_the_call(spark_connect, tmp_path):
    (tmp_path / "in").mkdir()
    stream = spark_connect.readStream.schema("user string").json(str(tmp_path / "in"))
    initial = spark_connect.createDataFrame([("a", 1)], "user string, count long")
    with pytest.raises(ConfigError, match="initial_state is not supported on a Spark Connect session"):
        transform_with_state(
            stream,
            key_columns=["user"],
            processor=RunningCount(),
            output_schema=OUTPUT,
            sink=str(tmp_path / "out"),
            checkpoint_location=str(tmp_path / "chk"),
            initial_state=initial,
        )
    assert not (tmp_path / "chk").exists()  # refused before anything was written
    with pytest.raises(ConfigError, match="needs a classic SparkSession"):
        read_state(spark_connect, str(tmp_path / "chk"))


def test_a_query_of_two_stateful_steps_runs_on_connect(spark_connect, tmp_path):
    """The aggregation after the step is built on the server too; both steps report their progress."""
    from dstl.backend.spark import stateful_stream

    config = {"dstl.storage": "local", "dstl.spark.working-dir": str(tmp_path / "working")}
    counts = stateful_stream(
        spark_connect.readStream.schema("user string")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in")),
        key_columns=["user"],
        processor=RunningCount(),
        output_schema=OUTPUT,
        config=config,
    )
    per_count = counts.selectExpr("user", "count AS n").groupBy("n").count()
    write_batch(tmp_path / "in", 0)
    write_batch(tmp_path / "in", 1)
    query = (
        per_count.writeStream.foreachBatch(sparks_sink(str(tmp_path / "out")))
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .start()
    )
    try:
        query.process_all_available()
        assert query.completed_batches == 2
        progress = query.last_progress
        assert [op["numRowsTotal"] for op in progress["stateOperators"]] == [3, 2]  # users a-c; n = 1, 2
    finally:
        query.stop()
    found = sorted(tmp_path.joinpath("out").glob("batch_id=*"))
    written = [
        sorted(map(tuple, pd.read_parquet(path)[["n", "count"]].itertuples(index=False))) for path in found
    ]
    assert written == [[(1, 1), (2, 1)], [(1, 2), (2, 2)]]  # batch 1: b now 2, c 1
