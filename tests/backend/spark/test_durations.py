"""Durations as Spark writes them, or milliseconds (the watermark delay)."""

import pytest

from dstl.backend.spark._private.durations import duration_ms, processing_interval_s


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("10 seconds", 10_000),
        ("1 minute", 60_000),
        ("500 ms", 500),
        ("500 milliseconds", 500),
        ("1 hour 30 minutes", 5_400_000),
        ("1h30m", 5_400_000),
        ("interval 5 minutes", 300_000),
        ("2 days", 172_800_000),
        (0, 0),
        (1500, 1500),
        (2.5, 2),
    ],
)
def test_durations(text, ms):
    assert duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "soon", "10 parsecs", "5 seconds later", "5", -1, True])
def test_what_is_no_duration_is_refused_with_an_example(text):
    with pytest.raises(ValueError, match="duration"):
        duration_ms(text)


@pytest.mark.parametrize(
    ("trigger", "seconds"),
    [
        ({"processingTime": "100 seconds"}, 100.0),
        ({"processingTime": "2 minutes"}, 120.0),
        ({"processingTime": "0 seconds"}, 0.0),
        ({"processingTime": "250 microseconds"}, 0.0),  # Spark's to check: no interval known here
        ({"availableNow": True}, 0.0),
        (None, 0.0),
    ],
)
def test_a_processing_time_triggers_interval(trigger, seconds):
    assert processing_interval_s(trigger) == seconds
