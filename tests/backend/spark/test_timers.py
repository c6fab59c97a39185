"""Timers, event time and initial state in Spark queries; an unmodified PySpark processor on dstl.

Input files are read one per batch (``maxFilesPerTrigger=1``), so both engines
see the same batches and batch ids, and outputs compare batch by batch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state

pyspark_api = pytest.importorskip("pyspark.sql.streaming.stateful_processor")

SCHEMA = "user string, count long, timed_out boolean"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class CountWithTimeout(pyspark_api.StatefulProcessor):
    """A running count per user that times out after a batch without the user (processing time).

    Written against PySpark's API only: it runs unmodified on transformWithStateInPandas and on dstl.
    """

    def init(self, handle):
        self.handle = handle
        handle.deleteIfExists("retired")  # allowed in init only, on Spark
        self.count = handle.getValueState("count", "count long")
        self.seen = handle.getMapState("seen", "batch long", "rows long")

    def handleInputRows(self, key, rows, timerValues):
        added = sum(len(frame) for frame in rows)
        current = self.count.get()
        total = (current[0] if current else 0) + added
        self.count.update((total,))
        self.seen.updateValue((timerValues.getCurrentProcessingTimeInMs(),), (added,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield pd.DataFrame({"user": [key[0]], "count": [total], "timed_out": [False]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        current = self.count.get()
        self.count.clear()
        self.seen.clear()
        yield pd.DataFrame({"user": [key[0]], "count": [current[0] if current else -1], "timed_out": [True]})

    def handleInitialState(self, key, initialState, timerValues):
        self.count.update((int(initialState["count"].sum()),))

    def close(self):
        pass


# file i is batch i: every user, then five of them, then one, then every user again
BATCHES = [
    [f"u{i}" for i in range(10)],
    [f"u{i}" for i in range(5)],
    ["u5"],
    [f"u{i}" for i in range(10)],
]
INITIAL = [("u0", 100), ("u1", 200), ("u42", 7)]


def write_batch(directory: Path, index: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"user": user, "v": 1}) for user in BATCHES[index] for _ in range(1 + index % 2)]
    temporary = directory / f".part-{index}.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    # the file source takes files in modification-time order: make it the batch order
    os.utime(temporary, (1_700_000_000 + index, 1_700_000_000 + index))
    temporary.rename(directory / f"part-{index:03d}.json")


def stream(spark, directory: Path):
    return spark.readStream.schema("user string, v long").option("maxFilesPerTrigger", 1).json(str(directory))


def collecting(into: dict[int, list[tuple]]):
    def sink(frame, batch_id):
        into[batch_id] = sorted(tuple(row) for row in frame.collect())

    return sink


def run_on_spark(
    spark, input_dir: Path, checkpoint: Path, processor=None, api: str = "transformWithStateInPandas"
) -> dict[int, list[tuple]]:
    """A processor (CountWithTimeout by default) on Spark's own operator ``api`` (RocksDB store)."""
    out: dict[int, list[tuple]] = {}
    initial = spark.createDataFrame(INITIAL, "user string, count long").groupBy("user")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    try:
        query = (
            getattr(stream(spark, input_dir).groupBy("user"), api)(
                statefulProcessor=processor or CountWithTimeout(),
                outputStructType=SCHEMA,
                outputMode="Update",
                timeMode="ProcessingTime",
                initialState=initial,
            )
            .writeStream.foreachBatch(collecting(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    return out


def run_on_dstl(spark, input_dir: Path, checkpoint: Path, config: dict, out: dict) -> list:
    """One availableNow run of the same processor class on dstl; returns the run's progress."""
    initial = spark.createDataFrame(INITIAL, "user string, count long")
    query = transform_with_state(
        stream(spark, input_dir),
        key_columns=["user"],
        processor=CountWithTimeout,
        output_schema=SCHEMA,
        sink=collecting(out),
        checkpoint_location=str(checkpoint),
        config=config,
        time_mode="ProcessingTime",
        initial_state=initial,
        trigger={"availableNow": True},
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    return query.progress


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_an_unmodified_pyspark_processor_gives_sparks_output(spark, tmp_path, placement):
    spark_input, dstl_input = tmp_path / "spark-in", tmp_path / "dstl-in"
    for index in range(len(BATCHES)):
        write_batch(spark_input, index)
    expected = run_on_spark(spark, spark_input, tmp_path / "spark-chk")
    assert sorted(expected) == list(range(len(BATCHES))), expected
    # the timeouts the test is about happened on Spark: idle users time out, one batch later
    assert [u for u, _, timed_out in expected[1] if timed_out] == [f"u{i}" for i in range(5, 10)]
    assert ("u0", 101, False) in expected[0]

    config = {
        "dstl.storage": "local",
        "dstl.spark.working-dir": str(tmp_path / "working"),
        "dstl.spark.placement": placement,
        "state.changelog.materialization.interval": "0s",
    }
    actual: dict[int, list[tuple]] = {}
    # two runs: the timers of the first run's last batch fire after a restart
    for index in range(2):
        write_batch(dstl_input, index)
    first = run_on_dstl(spark, dstl_input, tmp_path / "dstl-chk", config, actual)
    for index in range(2, len(BATCHES)):
        write_batch(dstl_input, index)
    second = run_on_dstl(spark, dstl_input, tmp_path / "dstl-chk", config, actual)
    assert actual == expected
    # batch 2 has rows of one user only: the other instance ran for its due timers alone
    by_batch = {p.batch_id: p for p in first + second}
    assert by_batch[2].woken_instances == 1, by_batch[2]
    assert [by_batch[b].timers_fired for b in range(len(BATCHES))] == [
        sum(1 for row in expected[b] if row[2]) for b in range(len(BATCHES))
    ]


class EventWindows(StatefulProcessor):
    """Tumbling 10 s windows per user, summed, emitted by an event-time timer when the watermark passes."""

    def init(self, context):
        self.context = context
        self.sums = context.get_map_state("sums")

    def handle_input_rows(self, key, rows):
        for ts in rows["ts"].tolist():
            start = ts // 10_000 * 10_000
            self.sums.put(start, (self.sums.get(start) or 0) + 1)
            self.context.register_timer(start + 10_000)
        return None

    def handle_expired_timer(self, key, expiry_ms, context):
        start = expiry_ms - 10_000
        total = self.sums.get(start)
        self.sums.remove(start)
        assert context.watermark_ms() >= expiry_ms
        return [{"user": key, "window": start, "events": total}]


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_event_time_windows_close_when_the_watermark_passes_them(spark, tmp_path, placement):
    """Spark's rules: a batch's timers fire by the watermark of the batches before it (starting at
    0), and its late rows are judged by the watermark the batch before it used.

    An instance woken with rows of its own in the batch gets them typed as without the wake row
    (its long ``ts`` stays a long: the fired windows are ints).
    """
    batches = [
        [("a", 1_000), ("b", 2_000), ("a", 12_000)],
        # watermark 12 000 - 5 000 = 7 000 fires timers; late rows are judged by batch 0's, 0: 3 000 counts
        [("a", 13_000), ("b", 25_000), ("a", 3_000)],
        [
            ("a", 40_000),
            ("a", 6_000),
        ],  # watermark 20 000: closes [0, 10 000) and [10 000, 20 000); 6 000 is late
        [("c", 41_000)],  # watermark 35 000: closes b's [20 000, 30 000) (b has no rows: woken)
    ]
    directory = tmp_path / "in"
    directory.mkdir()
    for index, rows in enumerate(batches):
        lines = [json.dumps({"user": user, "ts": ts}) for user, ts in rows]
        path = directory / f"part-{index:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    out: dict[int, list[tuple]] = {}
    query = transform_with_state(
        spark.readStream.schema("user string, ts long").option("maxFilesPerTrigger", 1).json(str(directory)),
        key_columns=["user"],
        processor=EventWindows,
        output_schema="user string, window long, events long",
        sink=collecting(out),
        checkpoint_location=str(tmp_path / "chk"),
        config={
            "dstl.storage": "local",
            "dstl.spark.working-dir": str(tmp_path / "working"),
            "state.changelog.materialization.interval": "0s",
            "dstl.spark.placement": placement,
        },
        event_time_column="ts",
        watermark_delay="5 seconds",
        trigger={"availableNow": True},
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    assert out == {
        0: [],
        1: [],
        2: [("a", 0, 2), ("a", 10_000, 2), ("b", 0, 1)],
        3: [("b", 20_000, 1)],
    }
    assert [p.late_rows for p in query.progress] == [0, 0, 1, 0]
    assert [p.watermark_ms for p in query.progress] == [0, 7_000, 20_000, 35_000]
    watermark = query.latest_checkpoint().time.watermark_ms
    assert watermark == 36_000


class Expiring(StatefulProcessor):
    """A value per key that lives one second after its write."""

    def init(self, context):
        self.value = context.get_value_state("value", ttl=1.0)

    def handle_input_rows(self, key, rows):
        self.value.update(len(rows))
        return None


def test_keys_that_expire_leave_the_working_state_of_every_instance(spark, tmp_path):
    """A background full snapshot finds them; the instance's next task removes them (carried over)."""
    from dstl.backend.keygroups import key_group_for
    from dstl.backend.spark import instance_for_key_group

    def instance_of(key):
        return instance_for_key_group(key_group_for(key, 128), 2, 128)

    live = [next(f"live-{i}" for i in range(100) if instance_of(f"live-{i}") == n) for n in (0, 1)]
    directory = tmp_path / "in"
    directory.mkdir()

    def write(index, keys):
        path = directory / f"part-{index:03d}.json"
        path.write_text("".join(json.dumps({"user": key}) + "\n" for key in keys))
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))

    def run():
        query = transform_with_state(
            spark.readStream.schema("user string").option("maxFilesPerTrigger", 1).json(str(directory)),
            key_columns=["user"],
            processor=Expiring,
            output_schema="user string",
            sink=collecting({}),
            checkpoint_location=str(tmp_path / "chk"),
            config={
                "dstl.storage": "local",
                "dstl.spark.working-dir": str(tmp_path / "working"),
                "dstl.spark.parallelism": "2",
                "state.changelog.materialization.interval": "0s",
            },
            trigger={"availableNow": True},
        )
        query.await_termination(timeout=300)
        assert query.exception() is None, query.exception()
        return query.progress

    write(0, [f"k{i}" for i in range(200)])
    run()
    time.sleep(1.5)  # every k... expires; the live keys are written again in each batch
    for index in range(1, 7):
        write(index, live)
    progress = run()
    assert sum(p.expired_removed for p in progress) == 200, [p.expired_removed for p in progress]
