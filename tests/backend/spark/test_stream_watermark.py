"""The stream's own watermark (``withWatermark``) is the one dstl follows, as Spark's operators do."""

import pytest

from dstl.backend.spark.query import stream_watermark
from dstl.spi import ConfigError


@pytest.fixture
def rate(spark):
    return spark.readStream.format("rate").load()  # columns: timestamp, value


def test_the_declared_watermark_is_the_default_column_and_delay(rate):
    marked = rate.withWatermark("timestamp", "10 seconds")
    assert stream_watermark(marked, None, None) == ("timestamp", 10_000)
    assert stream_watermark(marked, "timestamp", None) == ("timestamp", 10_000)
    assert stream_watermark(marked, "timestamp", "10 seconds") == ("timestamp", 10_000)  # the same: fine
    assert stream_watermark(rate, None, None) == (None, 0)  # no watermark declared: none
    assert stream_watermark(rate, "timestamp", 250) == ("timestamp", 250)


def test_a_contradicting_delay_or_column_is_refused(rate):
    marked = rate.withWatermark("timestamp", "10 seconds")
    with pytest.raises(ConfigError, match="contradicts the stream's withWatermark delay of 10000 ms"):
        stream_watermark(marked, "timestamp", "5 seconds")
    with pytest.raises(ConfigError, match="the stream's watermark is on 'timestamp'"):
        stream_watermark(marked.selectExpr("timestamp", "value AS other"), "other", None)
