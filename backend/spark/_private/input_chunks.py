"""A key's input rows in the chunks Spark's Arrow batch limits would cut them into.

``transformWithStateInPandas`` hands ``handleInputRows`` an iterator of frames: Spark
cuts a key's rows at ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows and at
``spark.sql.execution.arrow.maxBytesPerBatch`` bytes, each frame with a fresh 0-based
index. Processors that count or size those frames see the same ones on dstl.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

MAX_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
MAX_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
#: Spark's defaults of the two settings
DEFAULT_MAX_RECORDS = 10_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def byte_size(text: str) -> int:
    """A Spark byte size (``268435456``, ``256m``, ``256MB``)."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([a-zA-Z]*)\s*", text)
    if found is None or found.group(2).lower() not in _UNITS:
        msg = f"{MAX_BYTES_CONF}={text!r} is not a byte size"
        raise ValueError(msg)
    return int(found.group(1)) * _UNITS[found.group(2).lower()]


@dataclass(frozen=True)
class InputChunks:
    """Spark's Arrow batch limits of the session (0 or less: no limit), read once at the call."""

    max_records: int = DEFAULT_MAX_RECORDS
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def of(cls, session: Any) -> InputChunks:
        """The limits of ``session``'s conf."""
        records = session.conf.get(MAX_RECORDS_CONF, None)
        size = session.conf.get(MAX_BYTES_CONF, None)
        return cls(
            DEFAULT_MAX_RECORDS if records is None else int(records),
            DEFAULT_MAX_BYTES if size is None else byte_size(str(size)),
        )

    def split(self, rows: pd.DataFrame) -> Iterator[pd.DataFrame]:
        """``rows`` in chunks of at most the limits (at least one row each), indexes from 0."""
        per_chunk = len(rows)
        if self.max_records > 0:
            per_chunk = min(per_chunk, self.max_records)
        if self.max_bytes > 0 and len(rows):
            per_chunk = min(per_chunk, max(1, self.max_bytes // _row_bytes(rows)))
        if per_chunk >= len(rows):
            yield rows.reset_index(drop=True)
            return
        for start in range(0, len(rows), per_chunk):
            yield rows.iloc[start : start + per_chunk].reset_index(drop=True)


#: values of an object column sized to estimate a row's bytes: the estimate costs the same for any key
_SAMPLE = 16


def _row_bytes(rows: pd.DataFrame) -> int:
    """A row's estimated size: fixed-width columns by their type, object columns by a sample of values."""
    size = 0
    for column in rows.columns:
        series = rows[column]
        if series.dtype == object:
            sample = series.iloc[:_SAMPLE]
            size += 8 + sum(sys.getsizeof(value) for value in sample) // max(1, len(sample))
        else:
            size += getattr(series.dtype, "itemsize", 8)
    return max(1, size)
