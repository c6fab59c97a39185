"""A processor's output, whatever form it returned, as one list per output column."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["output_columns"]


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
        found = {name: [row.get(name) for row in rows] for name in columns if name in present}
    else:
        msg = f"a processor returns a DataFrame, a mapping of columns, row dicts or None, not {type(result)}"
        raise TypeError(msg)
    lengths = {len(values) for values in found.values()}
    if len(lengths) > 1:
        sizes = {name: len(values) for name, values in found.items()}
        msg = f"a processor returned output columns of different lengths: {sizes}"
        raise ValueError(msg)
    count = lengths.pop() if lengths else 0
    missing = [name for name in columns if name not in found]
    if missing and count:
        msg = f"a processor returned rows without the output columns {missing}"
        raise ValueError(msg)
    return {name: found.get(name, [None] * count) for name in columns}
