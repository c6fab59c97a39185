"""An instance's rows of a micro-batch as they reached Python: Arrow, or pandas.

On both Arrow placements (sticky and Spark's) the rows stay Arrow until something
reads them as pandas: a batch processor that reads keys, counts and a few columns
never pays for a pandas object per row (at 500,000 string keys, ``to_pandas`` took
longer than grouping and binding the keys). The ``applyInPandas`` placement hands
its pandas frame over as it is. Both kinds answer the few questions the task asks
before the processor runs (:class:`InstanceRows`), so that step has one code path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

__all__ = ["ArrowRows", "InstanceRows", "PandasRows", "frame_of"]


def frame_of(table: pa.Table, timezone: str) -> pd.DataFrame:
    """An Arrow table of rows as a pandas frame, converted as Spark's ``applyInPandas`` converts them."""
    import pyarrow as pa

    frame = table.to_pandas(coerce_temporal_nanoseconds=True)  # Spark hands pandas datetime64[ns]
    for field in table.schema:  # Spark hands pandas its timestamps as naive session-local times
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            frame[field.name] = frame[field.name].dt.tz_convert(timezone).dt.tz_localize(None)
    return frame


class InstanceRows(Protocol):
    """The questions the task asks of an instance's rows before its processor gets them."""

    def __len__(self) -> int:
        """How many rows."""
        ...

    @property
    def columns(self) -> list[str]:
        """The column names, in order."""
        ...

    def numbers(self, name: str) -> np.ndarray:
        """A numeric column as an array (nulls as NaN, as pandas has them)."""
        ...

    def where(self, mask: np.ndarray) -> InstanceRows:
        """The rows where ``mask`` is true, in order."""
        ...

    def without(self, names: Sequence[str]) -> InstanceRows:
        """The rows without the columns ``names``."""
        ...

    def frame(self) -> pd.DataFrame:
        """The rows as the pandas frame Spark's ``applyInPandas`` would hand over."""
        ...


@dataclass(frozen=True)
class PandasRows:
    """Rows that arrived as pandas (``applyInPandas``): every answer is the frame's own."""

    data: pd.DataFrame

    def __len__(self) -> int:
        """How many rows."""
        return len(self.data)

    @property
    def columns(self) -> list[str]:
        """The column names, in order."""
        return list(self.data.columns)

    def numbers(self, name: str) -> np.ndarray:
        """The column as an array."""
        return self.data[name].to_numpy()

    def where(self, mask: np.ndarray) -> PandasRows:
        """The rows where ``mask`` is true."""
        return PandasRows(self.data[mask])

    def without(self, names: Sequence[str]) -> PandasRows:
        """The frame without ``names``."""
        return PandasRows(self.data.drop(columns=list(names)))

    def frame(self) -> pd.DataFrame:
        """The frame itself."""
        return self.data


@dataclass(frozen=True)
class ArrowRows:
    """Rows that arrived as Arrow, turned into pandas (:func:`frame_of`) only when asked.

    :ivar table: the rows.
    :ivar timezone: Spark's session time zone (timestamps become naive local times in pandas).
    """

    table: pa.Table
    timezone: str

    def __len__(self) -> int:
        """How many rows."""
        return int(self.table.num_rows)

    @property
    def columns(self) -> list[str]:
        """The column names, in order."""
        return list(self.table.column_names)

    def numbers(self, name: str) -> np.ndarray:
        """The column as an array: a copy only when it has several chunks or nulls (then float, NaN)."""
        return self.table.column(name).to_numpy()

    def where(self, mask: np.ndarray) -> ArrowRows:
        """The rows where ``mask`` is true."""
        return ArrowRows(self.table.filter(mask), self.timezone)

    def without(self, names: Sequence[str]) -> ArrowRows:
        """The table without ``names`` (no copy of the other columns)."""
        return ArrowRows(self.table.drop_columns(list(names)), self.timezone)

    def select(self, names: Sequence[str]) -> ArrowRows:
        """Only the columns ``names`` (no copy)."""
        return ArrowRows(self.table.select(list(names)), self.timezone)

    def take(self, positions: Any) -> ArrowRows:
        """The rows at ``positions``, in that order."""
        return ArrowRows(self.table.take(positions), self.timezone)

    def frame(self) -> pd.DataFrame:
        """The rows as pandas, as Spark converts them."""
        return frame_of(self.table, self.timezone)
