"""Processors as PySpark users pass them, and mistakes known at the call refused at the call."""

import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark.demo.pipeline import DemoProcessor
from dstl.spi import ConfigError
from tests.backend.spark.test_query import assert_exact, local_config, run
from tests.backend.spark.test_timers import (
    BATCHES,
    INITIAL,
    SCHEMA,
    collecting,
    run_on_spark,
    stream,
    write_batch,
)


class _Counting(StatefulProcessor):
    def __init__(self, label):
        self.label = label

    def init(self, context):
        pass


def test_every_form_of_processor_becomes_a_factory_of_fresh_copies():
    from dstl.backend.spark._private.call_checks import adapted as _adapted

    instance = _Counting("mine")
    made = _adapted(instance)
    first, second = made(), made()
    assert first.label == second.label == "mine" and first is not second and first is not instance
    assert _adapted(DemoProcessor) is DemoProcessor
    factory = lambda: _Counting("made")  # noqa: E731
    assert _adapted(factory)().label == "made"
    for wrong in (42, "DemoProcessor", lambda: 42):
        with pytest.raises(ConfigError, match="is not a StatefulProcessor"):
            _adapted(wrong)


def test_a_processor_instance_runs_as_spark_runs_it(spark, tmp_path):
    """``processor=DemoProcessor()``, Spark's idiom: each task runs its own copy; the result is exact."""
    workdir = tmp_path / "job"
    run(spark, workdir, local_config(tmp_path), 2, processor=DemoProcessor())
    assert_exact(spark, workdir)


@pytest.mark.parametrize(
    ("key_columns", "event_time_column", "complaint"),
    [
        (["user"], None, "no column 'user'"),
        ([], None, "key_columns is empty"),
        (["value"], "ts", "no column 'ts'"),
    ],
)
def test_columns_the_stream_lacks_are_refused_at_the_call(
    spark, tmp_path, key_columns, event_time_column, complaint
):
    stream = spark.readStream.format("rate").load()  # columns: timestamp, value
    with pytest.raises(ConfigError, match=complaint):
        transform_with_state(
            stream,
            key_columns=key_columns,
            processor=DemoProcessor,
            output_schema="value long",
            sink=str(tmp_path / "out"),
            checkpoint_location=str(tmp_path / "chk"),
            event_time_column=event_time_column,
        )
    assert not (tmp_path / "chk").exists()  # nothing was started or written


def test_an_unreachable_kafka_storage_is_refused_at_the_call(spark, tmp_path):
    """Known at start (the driver binds the job on the storage), not when the first batch runs."""
    import time

    from dstl.backend.spark.demo.pipeline import write_input_file
    from dstl.dfs.testing import free_port
    from dstl.spi import StorageError

    write_input_file(tmp_path / "job" / "input", 0, 10)
    config = {
        "dstl.storage": "kafka",
        "dstl.kafka.bootstrap.servers": f"127.0.0.1:{free_port()}",  # nothing listens
        "dstl.kafka.request.timeout": "2s",
        "dstl.spark.working-dir": str(tmp_path / "working"),
    }
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach Kafka"):
        run(spark, tmp_path / "job", config, 1)
    assert time.monotonic() - started < 30
    assert not any(spark.streams.active)


def test_on_a_connect_session_sticky_placement_falls_back_to_sparks_and_an_initial_state_is_refused(caplog):
    from dstl.backend.spark._private.sessions import connect_config, is_connect
    from dstl.spi import Config

    assert is_connect(type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})())
    assert not is_connect(type("SparkSession", (), {"__module__": "pyspark.sql.session"})())
    with caplog.at_level("WARNING"):
        cfg = connect_config(Config({"dstl.spark.placement": "sticky"}), None)
    assert cfg.raw()["dstl.spark.placement"] == "spark"
    assert "needs the driver's JVM gateway" in caplog.text
    spark_placement = Config({"dstl.spark.placement": "spark"})
    assert connect_config(spark_placement, None) is spark_placement
    with pytest.raises(ConfigError, match="initial_state is not supported on a Spark Connect session"):
        connect_config(Config({}), object())


pyspark_api = pytest.importorskip("pyspark.sql.streaming.stateful_processor")


class RowCountWithTimeout(pyspark_api.StatefulProcessor):
    """test_timers' processor written for Spark's row-based transformWithState: Rows in and out."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        added = sum(1 for row in rows if row.v is not None)
        current = self.count.get()
        total = (current[0] if current else 0) + added
        self.count.update((total,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield Row(user=key[0], count=total, timed_out=False)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        from pyspark.sql import Row

        current = self.count.get()
        self.count.clear()
        yield Row(user=key[0], count=current[0] if current else -1, timed_out=True)

    def handleInitialState(self, key, initialState, timerValues):
        current = self.count.get()
        self.count.update(((current[0] if current else 0) + initialState["count"],))

    def close(self):
        pass


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_a_row_based_pyspark_processor_gives_sparks_output(spark, tmp_path, placement):
    """Spark's row-based ``transformWithState`` and dstl with ``processor_api="row"``, batch by batch."""
    for index in range(len(BATCHES)):
        write_batch(tmp_path / "in", index)
    expected = run_on_spark(
        spark, tmp_path / "in", tmp_path / "spark-chk", RowCountWithTimeout(), "transformWithState"
    )
    assert ("u0", 101, False) in expected[0]  # initial 100 + one row
    assert any(timed_out for _, _, timed_out in expected[1])

    actual: dict[int, list[tuple]] = {}
    query = transform_with_state(
        stream(spark, tmp_path / "in"),
        key_columns=["user"],
        processor=RowCountWithTimeout,
        processor_api="row",
        output_schema=SCHEMA,
        sink=collecting(actual),
        checkpoint_location=str(tmp_path / "dstl-chk"),
        config={**local_config(tmp_path), "dstl.spark.placement": placement},
        time_mode="ProcessingTime",
        initial_state=spark.createDataFrame(INITIAL, "user string, count long"),
        trigger={"availableNow": True},
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    assert actual == expected


def test_the_processor_api_is_checked_at_the_call():
    from dstl.backend.spark._private.call_checks import adapted as _adapted

    with pytest.raises(ConfigError, match="processor_api='row' is for PySpark StatefulProcessors"):
        _adapted(DemoProcessor, "row")
    with pytest.raises(ConfigError, match="processor_api='rows' is none of"):
        _adapted(RowCountWithTimeout, "rows")
    made = _adapted(lambda: RowCountWithTimeout(), "row")()  # a factory of a PySpark processor
    assert made._row_based
