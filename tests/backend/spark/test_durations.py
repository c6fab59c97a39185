"""Durations as Spark writes them, or milliseconds (the watermark delay)."""

import pytest

from dstl.backend.spark._private.durations import duration_ms


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
