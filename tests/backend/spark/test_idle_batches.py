"""Timers fire and the watermark takes effect on an idle stream, as Spark's no-data batches make them.

The same PySpark processor runs on Spark's ``transformWithStateInPandas`` and on dstl;
after the input's last row nothing more arrives, and the rows the timers emit must
come anyway, once each, across a restart too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from dstl.backend.spark import transform_with_state
from dstl.backend.spark._private.idle_batches import NO_DATA_BATCHES_CONF, wants_idle_batches
from dstl.backend.spark._private.query_record import QUERY_RECORD_FILE
from dstl.backend.spark.processor import TimeMode

pyspark_api = pytest.importorskip("pyspark.sql.streaming.stateful_processor")

SESSION_MS = 4_000
OUTPUT = "user string, count long, fired_late_ms long"
EVENT_OUTPUT = "user string, expiry long"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STORE_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


class SessionTimeout(pyspark_api.StatefulProcessor):
    """A count per user, emitted when the user was quiet for four seconds (processing time)."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        current = self.count.get()
        self.count.update(((current[0] if current else 0) + sum(len(frame) for frame in rows),))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + SESSION_MS)
        yield from ()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        current = self.count.get()
        self.count.clear()
        late = timerValues.getCurrentProcessingTimeInMs() - expiredTimerInfo.getExpiryTimeInMs()
        count = current[0] if current else -1
        yield pd.DataFrame({"user": [key[0]], "count": [count], "fired_late_ms": [late]})

    def close(self):
        pass


class EventSession(pyspark_api.StatefulProcessor):
    """An event-time timer five seconds after each user's latest event; it emits the user and expiry."""

    def init(self, handle):
        self.handle = handle
        self.latest = handle.getValueState("latest", "ms long")

    def handleInputRows(self, key, rows, timerValues):
        latest = max(int(ms) for frame in rows for ms in frame["ms"])
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.latest.update((latest,))
        self.handle.registerTimer(latest + 5_000)
        yield from ()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.latest.clear()
        yield pd.DataFrame({"user": [key[0]], "expiry": [expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self):
        pass


@pytest.fixture(autouse=True)
def sparks_defaults(spark):
    """No-data batches on, Spark's default (the shared test session turns them off); Spark's
    operator on RocksDB, the store it requires."""
    before = spark.conf.get(NO_DATA_BATCHES_CONF)
    spark.conf.set(NO_DATA_BATCHES_CONF, "true")
    spark.conf.set(STORE_PROVIDER_CONF, ROCKSDB)
    yield
    spark.conf.set(NO_DATA_BATCHES_CONF, before)
    spark.conf.unset(STORE_PROVIDER_CONF)


def write_file(directory: Path, index: int, rows: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".part-{index}.tmp"
    temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.utime(temporary, (1_700_000_000 + index, 1_700_000_000 + index))
    temporary.rename(directory / f"part-{index:03d}.json")


class Collected:
    """An idempotent ``foreachBatch`` sink (a replayed batch overwrites its rows), and a wait for rows."""

    def __init__(self) -> None:
        self.by_batch: dict[int, list[tuple]] = {}
        self._changed = threading.Condition()

    @property
    def rows(self) -> list[tuple]:
        with self._changed:
            return [row for rows in self.by_batch.values() for row in rows]

    def __call__(self, frame, batch_id) -> None:
        rows = [tuple(row) for row in frame.collect()]
        with self._changed:
            self.by_batch[batch_id] = rows
            self._changed.notify_all()

    def wait_for(self, count: int, query, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(len(rows) for rows in self.by_batch.values()) < count:
                assert query.exception() is None, query.exception()
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"only {self.rows} after {timeout} s"
                self._changed.wait(min(remaining, 0.5))


def start_on_spark(frame, processor, output, time_mode, sink, checkpoint):
    """The processor on Spark's own transformWithStateInPandas, a batch at least every second."""
    return (
        frame.groupBy("user")
        .transformWithStateInPandas(
            statefulProcessor=processor, outputStructType=output, outputMode="Update", timeMode=time_mode
        )
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


USERS = ["a", "a", "b", "c", "c", "c"]
EXPECTED_COUNTS = [("a", 2), ("b", 1), ("c", 3)]


def dstl_config(tmp_path: Path, placement: str) -> dict:
    return {
        "dstl.storage": "local",
        "dstl.spark.working-dir": str(tmp_path / "working"),
        "dstl.spark.placement": placement,
    }


def test_sparks_engine_closes_the_sessions_of_an_idle_stream(spark, tmp_path):
    """The specification: Spark's own operator, one input file, then nothing."""
    write_file(tmp_path / "in", 0, [{"user": user} for user in USERS])
    out = Collected()
    frame = spark.readStream.schema("user string").json(str(tmp_path / "in"))
    query = start_on_spark(frame, SessionTimeout(), OUTPUT, "ProcessingTime", out, tmp_path / "chk")
    try:
        out.wait_for(len(EXPECTED_COUNTS), query)
    finally:
        query.stop()
    assert sorted(row[:2] for row in out.rows) == EXPECTED_COUNTS


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_processing_time_timers_fire_on_an_idle_stream_once_across_a_restart(spark, tmp_path, placement):
    write_file(tmp_path / "in", 0, [{"user": user} for user in USERS])
    out = Collected()

    def start():
        return transform_with_state(
            spark.readStream.schema("user string").json(str(tmp_path / "in")),
            key_columns=["user"],
            processor=SessionTimeout,
            output_schema=OUTPUT,
            sink=out,
            checkpoint_location=str(tmp_path / "chk"),
            config=dstl_config(tmp_path, placement),
            time_mode="ProcessingTime",
        )

    query = start()
    try:  # the input's batch; the query stops (most likely) before the timers are due
        assert query.wait_for_batches(1, timeout=90), query.exception()
    finally:
        query.stop()
    assert json.loads((tmp_path / "chk" / QUERY_RECORD_FILE).read_text())["idle_batches"] is True
    time.sleep(SESSION_MS / 1000)
    query = start()  # no new input: the timers are due, and only the heartbeat runs batches
    try:
        out.wait_for(len(EXPECTED_COUNTS), query)
        ran = query.completed_batches
        assert query.wait_for_batches(ran + 3, timeout=90), query.exception()
    finally:
        query.stop()
    assert sorted(row[:2] for row in out.rows) == EXPECTED_COUNTS  # each once, whichever run fired it
    # fired by the first batch after the expiry: a heartbeat (a second) and a batch's start late
    assert all(0 <= late < 30_000 for *_, late in out.rows), out.rows
    # the heartbeat's batches in which nothing ran wrote nothing to the sink
    assert all(rows or batch_id == 0 for batch_id, rows in out.by_batch.items()), out.by_batch


def test_event_time_timers_fire_when_the_watermark_passes_them_without_new_rows(spark, tmp_path):
    """One file; the watermark it moves fires a's and b's timers in the next batch, on both engines."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [("a", 1_000), ("b", 2_000), ("c", 60_000)]
    base_ms = int(at.timestamp() * 1000)
    write_file(
        tmp_path / "in",
        0,
        [
            {"user": user, "ts": (at + dt.timedelta(milliseconds=ms)).isoformat(), "ms": base_ms + ms}
            for user, ms in rows
        ],
    )
    expected = [("a", base_ms + 6_000), ("b", base_ms + 7_000)]  # c's at 65 s: the watermark is 60 s

    def stream():
        frame = spark.readStream.schema("user string, ts timestamp, ms long").json(str(tmp_path / "in"))
        return frame.withWatermark("ts", "0 seconds")

    on_spark = Collected()
    query = start_on_spark(
        stream(), EventSession(), EVENT_OUTPUT, "EventTime", on_spark, tmp_path / "spark-chk"
    )
    try:
        on_spark.wait_for(len(expected), query)
    finally:
        query.stop()
    assert sorted(on_spark.rows) == expected

    on_dstl = Collected()
    query = transform_with_state(
        stream(),
        key_columns=["user"],
        processor=EventSession,
        output_schema=EVENT_OUTPUT,
        sink=on_dstl,
        checkpoint_location=str(tmp_path / "dstl-chk"),
        config=dstl_config(tmp_path, "sticky"),
        time_mode="EventTime",
    )
    try:
        on_dstl.wait_for(len(expected), query)
        ran = query.completed_batches
        assert query.wait_for_batches(ran + 2, timeout=90), query.exception()
    finally:
        query.stop()
    assert sorted(on_dstl.rows) == sorted(on_spark.rows)


def test_idle_batches_come_with_timers_and_a_trigger_that_does_not_end():
    assert wants_idle_batches(TimeMode.PROCESSING, None, no_data_batches=True)
    assert wants_idle_batches(TimeMode.EVENT, {"processingTime": "5 seconds"}, no_data_batches=True)
    assert not wants_idle_batches(TimeMode.NONE, None, no_data_batches=True)
    assert not wants_idle_batches(TimeMode.PROCESSING, {"availableNow": True}, no_data_batches=True)
    assert not wants_idle_batches(TimeMode.EVENT, {"once": True}, no_data_batches=True)
    assert not wants_idle_batches(TimeMode.EVENT, None, no_data_batches=False)
