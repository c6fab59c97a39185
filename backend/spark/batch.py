"""An operator instance's rows of a micro-batch, grouped by key once: sorted, with key offsets.

Grouping costs one vectorized pass (``ngroup`` and a stable sort), not a pandas
object per key: a batch processor reads whole columns and the per-key offsets,
and the per-key API slices the sorted rows. Rows that reached Python as Arrow are
grouped as Arrow and become pandas only when :attr:`KeyedBatch.rows` is read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._private.instance_rows import ArrowRows

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from ..keyed import KeySet

__all__ = ["KeyedBatch"]


class KeyedBatch:
    """Rows grouped by key: ``rows`` sorted so each key's rows are contiguous.

    :ivar rows: the rows, each key's together, keys in the order of :attr:`keys`
        (pandas; sorted when first read, so a processor that reads only keys and counts
        never copies the rows).
    :ivar keys: the distinct keys (Python values; a tuple per key when the key has
        several columns): in the state store's order when grouped in Arrow with their
        key groups (as a Spark task does), else in first-seen order. Spark promises no
        order of keys either.
    :ivar offsets: ``len(keys) + 1`` row positions: key ``i``'s rows are
        ``rows[offsets[i]:offsets[i + 1]]``.
    :ivar key_set: the keys bound for bulk state access (``ValueState.get_many``...).
    :ivar first_rows: where each key's first row was in the frame :meth:`of` grouped
        (``None`` for a batch built otherwise).
    """

    def __init__(
        self, rows: pd.DataFrame, keys: list[Any], offsets: np.ndarray, key_set: KeySet | None = None
    ) -> None:
        self._rows: pd.DataFrame | None = rows
        self._order: np.ndarray | None = None  # set by :meth:`of`: ``rows`` is the frame, unsorted
        self._arrow: ArrowRows | None = None  # set by :meth:`of` for Arrow rows: decoded when read
        self._columns: dict[str, np.ndarray] = {}  # columns of Arrow rows decoded one by one
        #: where the time spent turning Arrow rows into pandas is added up (``to_pandas``, ms)
        self.decode_phases: dict[str, float] | None = None
        self.keys = keys
        self.offsets = offsets
        self.key_set = key_set
        self.first_rows: np.ndarray | None = None

    @property
    def rows(self) -> pd.DataFrame:
        """The rows, each key's together, keys in the order of :attr:`keys`."""
        if self._arrow is not None:  # Arrow is sorted first: the pandas frame is built in order
            with self._decoding():
                self._rows = self._arrow.take(self._order).frame()
            self._arrow = self._order = None
            self._columns.clear()
        elif self._order is not None:
            assert self._rows is not None
            self._rows = self._rows.iloc[self._order].reset_index(drop=True)
            self._order = None
        assert self._rows is not None
        return self._rows

    @classmethod
    def of(
        cls,
        rows: pd.DataFrame | ArrowRows,
        key_columns: Sequence[str],
        key_groups: np.ndarray | None = None,
    ) -> KeyedBatch:
        """Group ``rows`` by ``key_columns`` (null is a key of its own, as in ``groupby(dropna=False)``).

        Arrow rows stay Arrow: their keys are the values their pandas frame would give.

        :param key_groups: each row's key group (Spark's routing). With them, keys grouped
            in Arrow come in the state store's order (key group, then key) rather than
            first-seen: the batch's reads and writes then walk the store's pages in
            order instead of jumping (twice as fast at 500k random keys).
        """
        import numpy as np

        columns = list(key_columns)
        if not len(rows):
            frame = rows.frame() if isinstance(rows, ArrowRows) else rows
            return cls(frame, [], np.zeros(1, dtype=np.int64))
        ids, keys = _arrow_grouped(rows, columns, key_groups) if isinstance(rows, ArrowRows) else (None, None)
        if ids is None:  # a pandas frame; or Arrow keys whose pandas values differ from Arrow's
            key_frame = rows.select(columns).frame() if isinstance(rows, ArrowRows) else rows
            ids = _group_ids(key_frame, columns)
        order = np.argsort(ids, kind="stable")
        counts = np.bincount(ids)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        first_rows = order[offsets[:-1]]
        if keys is None:
            keys = _keys_at(key_frame, columns, first_rows)
        batch = cls(None if isinstance(rows, ArrowRows) else rows, keys, offsets)
        batch._order = order
        batch._arrow = rows if isinstance(rows, ArrowRows) else None
        batch.first_rows = first_rows
        return batch

    def __len__(self) -> int:
        """How many keys."""
        return len(self.keys)

    def counts(self) -> np.ndarray:
        """Rows per key, in key order."""
        import numpy as np

        return np.diff(self.offsets)

    def rows_of(self, index: int) -> pd.DataFrame:
        """Key ``index``'s rows (a slice of :attr:`rows`)."""
        return self.rows.iloc[self.offsets[index] : self.offsets[index + 1]]

    def per_key(self) -> Iterator[tuple[Any, pd.DataFrame]]:
        """``(key, rows)`` of every key, in order."""
        offsets = self.offsets.tolist()
        rows = self.rows
        for index, key in enumerate(self.keys):
            yield key, rows.iloc[offsets[index] : offsets[index + 1]]

    def column(self, name: str) -> np.ndarray:
        """A column of :attr:`rows` as an array, in row order (of Arrow rows, only that column is decoded)."""
        if self._arrow is not None:
            if name not in self._columns:
                with self._decoding():
                    self._columns[name] = (
                        self._arrow.select([name]).take(self._order).frame()[name].to_numpy()
                    )
            return self._columns[name]
        return self.rows[name].to_numpy()

    @contextmanager
    def _decoding(self) -> Iterator[None]:
        """Time a conversion of Arrow rows to pandas into :attr:`decode_phases` (``to_pandas``)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            if self.decode_phases is not None:
                spent = (time.perf_counter() - began) * 1000
                self.decode_phases["to_pandas"] = round(self.decode_phases.get("to_pandas", 0.0) + spent, 3)


def _keys_at(frame: pd.DataFrame, columns: list[str], positions: np.ndarray) -> list[Any]:
    """The keys at ``positions`` of ``frame``: Python values, a tuple per key of several columns."""
    if len(columns) == 1:
        return list(frame[columns[0]].take(positions).tolist())
    return list(zip(*(frame[column].take(positions).tolist() for column in columns), strict=True))


def _arrow_grouped(
    rows: ArrowRows, columns: list[str], key_groups: np.ndarray | None
) -> tuple[np.ndarray | None, list[Any] | None]:
    """Group ids and keys of one Arrow key column whose Python values are its pandas values.

    Strings, and integers without nulls, convert alike (pandas turns an integer column
    with nulls into floats); ``(None, None)`` for any other key. With ``key_groups``
    (each row's), the groups are numbered in the store's order (:func:`_store_ordered`).
    """
    import pyarrow as pa

    if len(columns) != 1:
        return None, None
    values = rows.table.column(columns[0])
    kind = values.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and not (
        pa.types.is_integer(kind) and values.null_count == 0
    ):
        return None, None
    ids, distinct = _encoded(values.combine_chunks())
    if key_groups is not None and len(key_groups) == len(ids) and len(distinct) > 1:
        ids, distinct = _store_ordered(ids, distinct, key_groups)
    return ids, distinct.to_pylist()  # the distinct values in their groups' order: the keys


def _store_ordered(
    ids: np.ndarray, distinct: pa.Array, key_groups: np.ndarray
) -> tuple[np.ndarray, pa.Array]:
    """``ids`` renumbered and ``distinct`` reordered as the state store orders their keys.

    The LMDB working copy keeps a key's records under its key group, then the length
    of its stored (msgpack) bytes, then those bytes. Only locality rides on it: any
    order is correct. One Arrow sort by value, then a stable numpy sort by the tiers
    above it (a third faster than Arrow's sort of all the columns at once).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    first = np.empty(len(distinct), dtype=np.int64)
    first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # each group's first row: the last write wins
    by_value = pc.sort_indices(distinct).to_numpy()  # a null last (Arrow's default)
    tiers = (np.asarray(key_groups)[first], *_stored_tiers(distinct))  # most significant first
    order = by_value[np.lexsort(tuple(tier[by_value] for tier in reversed(tiers)))]
    renumbered = np.empty(len(order), dtype=np.int64)
    renumbered[order] = np.arange(len(order))
    return renumbered[ids], distinct.take(pa.array(order))


#: msgpack's integer widths: a non-negative value below each bound takes that many bytes
_UNSIGNED_WIDTHS = ((128, 1), (1 << 8, 2), (1 << 16, 3), (1 << 32, 5))
_SIGNED_WIDTHS = ((-32, 1), (-(1 << 7), 2), (-(1 << 15), 3), (-(1 << 31), 5))  # a negative at or above


def _stored_tiers(values: pa.Array) -> tuple[np.ndarray, ...]:
    """What orders ``values``' stored bytes before their value does (strings, or integers without nulls).

    A string's header depends only on its UTF-8 length (a null is one byte, ``0xc0``,
    after the empty string's ``0xa0``). An integer's width comes first, then its sign
    (a width's non-negative tags are below its negative ones); within one width and
    sign, big-endian two's complement orders as the value.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return (pc.fill_null(pc.binary_length(values), 0).to_numpy(),)
    numbers = values.to_numpy()
    negative = numbers < 0
    width = np.full(len(numbers), 9, dtype=np.int8)
    for bound, size in reversed(_UNSIGNED_WIDTHS):
        width[~negative & (numbers < bound)] = size
    for bound, size in reversed(_SIGNED_WIDTHS):
        width[negative & (numbers >= bound)] = size
    return width, negative


def _encoded(values: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Each value's group number (first-seen order, null a group of its own), and the groups' values."""
    import numpy as np
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(values, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64), encoded.dictionary


def _group_ids(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Each row's group number, groups numbered in first-seen order (null a group of its own).

    One column of strings or integers is encoded by Arrow (a third of pandas' time
    at 100k rows); any other key, and a column Arrow cannot type, by pandas.
    """
    import pandas as pd

    if len(columns) == 1:
        column = frame[columns[0]]
        if column.dtype == object or pd.api.types.is_integer_dtype(column.dtype):
            import pyarrow as pa

            try:
                values = pa.array(column, from_pandas=True)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                values = None
            if values is not None and (
                pa.types.is_string(values.type)
                or pa.types.is_large_string(values.type)
                or pa.types.is_integer(values.type)
            ):
                return _encoded(values)[0]
    return frame.groupby(columns, sort=False, dropna=False).ngroup().to_numpy()
