"""A processor's output, whatever form it returned, as one list per output column, checked as Spark does."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["check_output_types", "output_batch", "output_columns"]


def output_columns(result: Any, columns: tuple[str, ...]) -> dict[str, list[Any]]:
    """A processor's output as one list per output column (equal lengths), whatever form it came in.

    :raises TypeError: on a result that is no DataFrame, mapping, iterable of dicts or ``None``.
    :raises ValueError: on rows that lack an output column, or columns of different lengths.
    """
    import pandas as pd

    if result is None:
        return {name: [] for name in columns}
    if isinstance(result, pd.DataFrame):
        found = {name: result[name].tolist() for name in result.columns}
    elif isinstance(result, Mapping):
        found = {name: list(values) for name, values in result.items()}
    elif isinstance(result, Iterable):
        rows = list(result)
        if any(not isinstance(row, Mapping) for row in rows):
            msg = "a processor's output rows must be dicts (column -> value)"
            raise TypeError(msg)
        present = {name for row in rows for name in row}
        found = {name: [row.get(name) for row in rows] for name in present}
    else:
        msg = f"a processor returns a DataFrame, a mapping of columns, row dicts or None, not {type(result)}"
        raise TypeError(msg)
    lengths = {len(values) for values in found.values()}
    if len(lengths) > 1:
        sizes = {name: len(values) for name, values in found.items()}
        msg = f"a processor returned output columns of different lengths: {sizes}"
        raise ValueError(msg)
    count = lengths.pop() if lengths else 0
    unexpected = [name for name in found if name not in columns]
    if unexpected and count:  # Spark's applyInPandas refuses them too (RESULT_COLUMNS_MISMATCH)
        msg = f"a processor returned columns {unexpected} that output_schema lacks (it has {list(columns)})"
        raise ValueError(msg)
    missing = [name for name in columns if name not in found]
    if missing and count:
        msg = f"a processor returned rows without the output columns {missing}"
        raise ValueError(msg)
    return {name: found.get(name, [None] * count) for name in columns}


@functools.lru_cache(maxsize=16)
def _arrow_types(schema_json: str, timezone: str = "UTC") -> tuple[tuple[str, str, Any], ...]:
    """``(column, Spark type, Arrow type)`` of an output schema (Spark's JSON form).

    :param timezone: the zone of timestamp columns (Spark's session time zone).
    """
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(schema_json))
    return tuple(
        (f.name, f.dataType.simpleString(), to_arrow_type(f.dataType, timezone=timezone))
        for f in schema.fields
    )


def check_output_types(output: Mapping[str, list[Any]], schema_json: str) -> None:
    """Each output column converts to its declared type as Spark's Arrow conversion does.

    Whatever the placement, a value that does not fit is an error naming the column,
    never a NULL (``createDataFrame(..., verifySchema=False)`` would store one).

    :raises TypeError: naming the column, its type and why the value does not fit.
    """
    import pyarrow as pa

    for name, spark_type, arrow_type in _arrow_types(schema_json):
        values = output.get(name)
        if not values:
            continue
        try:
            pa.array(values, type=arrow_type, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            msg = f"output column {name!r} is {spark_type} in output_schema, but a processor returned: {exc}"
            raise TypeError(msg) from exc


def output_batch(
    output: Mapping[str, list[Any]], schema_json: str, timezone: str, *, report: str | None = None
) -> Any:
    """Checked output columns as one Arrow record batch of the output schema plus the report column.

    Converted as Spark's Arrow conversion of pandas output does: nulls from ``None``
    and NaN, naive timestamps as times of the session's ``timezone``. Without
    ``output`` columns: one row carrying ``report`` (the instance's report).
    """
    import pyarrow as pa

    from .columns import REPORT_COLUMN

    types = _arrow_types(schema_json, timezone)
    count = len(next(iter(output.values()), [])) if output else 1
    arrays, fields = [], []
    for name, _, arrow_type in types:
        values = output.get(name, [None] * count)
        arrays.append(pa.array(_localized(values, arrow_type, timezone), type=arrow_type, from_pandas=True))
        fields.append(pa.field(name, arrow_type))
    arrays.append(pa.array([report] * count if report is not None else [None] * count, type=pa.string()))
    fields.append(pa.field(REPORT_COLUMN, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _localized(values: list[Any], arrow_type: Any, timezone: str) -> Any:
    """Timestamps with a zone: naive values are session-local times (Spark's reading of pandas output)."""
    import pandas as pd
    import pyarrow as pa

    if not values or not pa.types.is_timestamp(arrow_type) or arrow_type.tz is None:
        return values
    series = pd.to_datetime(pd.Series(values))
    if series.dt.tz is None:
        series = series.dt.tz_localize(timezone)
    return series
