"""Processors as PySpark users pass them, and mistakes known at the call refused at the call."""

import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark.demo.pipeline import DemoProcessor
from dstl.spi import ConfigError
from tests.backend.spark.test_query import assert_exact, local_config, run


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


def test_a_spark_connect_session_is_refused_at_the_call_naming_the_difference():
    from dstl.backend.spark._private.call_checks import check_classic_session

    connect_session = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    with pytest.raises(ConfigError, match="Spark Connect sessions are not supported yet"):
        check_classic_session(connect_session)
    classic = type("SparkSession", (), {"__module__": "pyspark.sql.session"})()
    check_classic_session(classic)  # no error
