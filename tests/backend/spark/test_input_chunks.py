"""A key's input frames cut at Spark's Arrow batch limits, as ``transformWithStateInPandas`` hands them."""

import pandas as pd
import pytest

from dstl.backend.spark._private.input_chunks import InputChunks, byte_size


def _sizes(chunks: InputChunks, rows: int) -> list[int]:
    frame = pd.DataFrame(
        {"id": [str(i) for i in range(rows)], "n": range(rows)}, index=range(100, 100 + rows)
    )
    frames = list(chunks.split(frame))
    assert all(list(part.index) == list(range(len(part))) for part in frames)  # fresh 0-based indexes
    assert pd.concat(frames)["n"].tolist() == list(range(rows))  # every row once, in order
    return [len(part) for part in frames]


@pytest.mark.parametrize(
    ("chunks", "sizes"),
    [
        (InputChunks(), [5]),
        (InputChunks(max_records=2), [2, 2, 1]),
        (InputChunks(max_records=-1, max_bytes=-1), [5]),
        (InputChunks(max_records=0), [5]),
        (InputChunks(max_bytes=2), [1, 1, 1, 1, 1]),  # a row is never cut
        (InputChunks(max_records=3, max_bytes=100_000), [3, 2]),
    ],
)
def test_rows_are_cut_at_the_smaller_limit(chunks, sizes):
    assert _sizes(chunks, 5) == sizes


def test_byte_sizes_read_as_spark_writes_them():
    assert byte_size("268435456") == 256 * 1024 * 1024 == byte_size("256m") == byte_size("256MB")
    with pytest.raises(ValueError, match="is not a byte size"):
        byte_size("lots")
