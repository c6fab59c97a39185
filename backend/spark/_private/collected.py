"""Rows a processor returned, key by key or timer by timer, gathered column-wise."""

from __future__ import annotations

from typing import Any

__all__ = ["Collected"]


class Collected:
    """Per-key results gathered column-wise, without a pandas Series per column and key.

    A key's small DataFrame is read as one object array (``to_numpy(dtype=object)``:
    the same Python values ``Series.tolist`` gives, ~15 µs a frame instead of ~50).
    """

    def __init__(self) -> None:
        self._columns: dict[str, list[Any]] = {}
        self._rows = 0

    def add(self, result: Any) -> None:
        if result is None:
            return
        if hasattr(result, "columns") and hasattr(result, "to_numpy"):  # a pandas DataFrame
            count = len(result)
            if not count:
                return
            rows = result.to_numpy(dtype=object).tolist()
            for name, values in zip(result.columns, zip(*rows, strict=True), strict=True):
                self._column(name).extend(values)
            self._rows += count
            self._pad()
            return
        for row in result:
            for name, value in row.items():
                self._column(name).append(value)
            self._rows += 1
            self._pad()

    def columns(self) -> dict[str, list[Any]]:
        """Everything added, as column name -> values (None where a result left a column out)."""
        return self._columns

    def _column(self, name: str) -> list[Any]:
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = [None] * self._rows
        return column

    def _pad(self) -> None:
        """Columns a result left out hold None in its rows."""
        for column in self._columns.values():
            if len(column) < self._rows:
                column.extend([None] * (self._rows - len(column)))
