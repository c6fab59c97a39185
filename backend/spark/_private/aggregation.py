"""``groupBy(...).count()`` / ``agg(...)`` after a stateful step: a streaming aggregation on dstl's state.

Spark's rules for a streaming aggregation, as the query's next stateful step:

- ``update``: every batch emits the groups its rows changed, with their running
  aggregates; with the query's event time among the group columns, a group's state
  is dropped once the watermark passes it (without being emitted again).
- ``append``: needs the event time among the group columns; a group is emitted
  once, final, in the batch whose watermark reaches its event time, and dropped.
- rows at or below the batch's late-event watermark are dropped as late (event time).

The state of a group is one value: a partial aggregate per aggregate (``count``, a
sum, a ``[sum, count]`` pair for ``avg``, a ``min``/``max``). Timestamp group
columns reach the step as epoch microseconds (the key hash takes numbers and
strings) and leave it as timestamps again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstl.spi import ConfigError

from ..processor import StatefulProcessor

if TYPE_CHECKING:
    import pandas as pd

    from ..batch import KeyedBatch
    from ..processor import StateContext

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "EVENT_COPY_COLUMN",
    "Aggregate",
    "Aggregation",
    "AggregationProcessor",
    "aggregate_for",
    "result_type",
]

#: Spark's names of the aggregate functions supported, and the name each gives its column.
AGGREGATE_FUNCTIONS = {
    "count": "count",
    "sum": "sum",
    "avg": "avg",
    "mean": "avg",
    "min": "min",
    "max": "max",
}
#: The group's event time (a timestamp) beside its microseconds: the step's event-time column.
EVENT_COPY_COLUMN = "__dstl_group_event_time"
#: The aggregation's one state: a list of partial aggregates per group.
_STATE = "aggregates"


@dataclass(frozen=True)
class Aggregate:
    """One aggregate: ``function`` of ``column`` (``None``: ``count()`` of rows) named ``name``.

    :ivar integral: a ``sum`` of an integral column (kept as an ``int``, as Spark's ``bigint``).
    """

    function: str
    column: str | None
    name: str
    integral: bool = False


@dataclass(frozen=True)
class Aggregation:
    """``groupBy(group_columns).agg(aggregates)`` in output mode ``mode``.

    :ivar event_column: the group column that carries the query's event time (``None``: none does).
    """

    group_columns: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    event_column: str | None
    mode: str = "update"

    def checked(self, mode: str) -> Aggregation:
        """This aggregation in output mode ``mode``, as Spark allows it.

        :raises ConfigError: ``append`` without the event time among the group columns,
            or ``complete``.
        """
        if mode == "append" and self.event_column is None:
            msg = (
                "append output mode needs the query's event time among the groupBy columns (Spark's rule "
                "for a streaming aggregation: a group is final once the watermark passes it): group by "
                "the stateful step's output_event_time_column, or use outputMode('update')"
            )
            raise ConfigError(msg)
        if mode not in {"append", "update"}:
            msg = (
                f"outputMode({mode!r}) after groupBy(): dstl emits append or update (complete would re-emit "
                "every group of a state that may outgrow memory, every batch)"
            )
            raise ConfigError(msg)
        return Aggregation(self.group_columns, self.aggregates, self.event_column, mode)


def _merge(function: str, old: Any, new: Any) -> Any:
    """Two partial aggregates of ``function`` as one (``None``: no value yet)."""
    if old is None:
        return new
    if new is None:
        return old
    if function == "count":
        return old + new
    if function == "sum":
        return old + new
    if function == "avg":
        return [_merge("sum", old[0], new[0]), old[1] + new[1]]
    return min(old, new) if function == "min" else max(old, new)


def _result(function: str, partial: Any) -> Any:
    if function == "count":
        return partial or 0
    if function == "avg":
        return None if partial is None or partial[1] == 0 or partial[0] is None else partial[0] / partial[1]
    return partial


def _plain(values: pd.Series) -> list[Any]:
    """A series as Python values, nulls (NaN, NaT) as ``None``."""
    return values.astype(object).where(values.notna(), None).tolist()


def _partials(aggregate: Aggregate, batch: KeyedBatch, ids: Any) -> list[Any]:
    """``aggregate`` over each key's rows of ``batch``, as partial aggregates in key order.

    Nulls are left out first, as Spark's aggregates skip them (and pandas cannot order
    a string column holding them).
    """
    keys = len(batch.keys)
    if aggregate.column is None:
        return batch.counts().tolist()
    column = batch.rows[aggregate.column]
    present = column.notna().to_numpy()
    grouped = column[present].groupby(ids[present], sort=True)
    if aggregate.function == "count":
        return grouped.count().reindex(range(keys), fill_value=0).tolist()
    if aggregate.function in {"sum", "avg"}:
        sums = _plain(grouped.sum().reindex(range(keys)))
        sums = [None if s is None else (int(s) if aggregate.integral else float(s)) for s in sums]
        if aggregate.function == "sum":
            return sums
        counts = grouped.count().reindex(range(keys), fill_value=0).tolist()
        return [None if s is None else [s, c] for s, c in zip(sums, counts, strict=True)]
    extreme = grouped.min() if aggregate.function == "min" else grouped.max()
    return _plain(extreme.reindex(range(keys)))


class AggregationProcessor(StatefulProcessor):
    """Folds each group's rows into its partial aggregates; emits by the output mode (module doc)."""

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation

    def init(self, context: StateContext) -> None:
        """The one state: the partial aggregates of each group."""
        self.context = context
        self.partials = context.get_value_state(_STATE, serializer="spark")

    def handle_batch(self, batch: KeyedBatch, context: StateContext) -> dict[str, list[Any]]:
        """Fold the batch's rows of every group; in update mode, emit the groups changed."""
        import numpy as np

        aggregation = self.aggregation
        keys = batch.key_set if batch.key_set is not None else batch.keys
        ids = np.repeat(np.arange(len(batch.keys)), batch.counts())
        columns = [_partials(aggregate, batch, ids) for aggregate in aggregation.aggregates]
        functions = [aggregate.function for aggregate in aggregation.aggregates]
        before = self.partials.get_many(keys)
        after = []
        for index, old in enumerate(before):
            new = [column[index] for column in columns]
            after.append(
                new if old is None else [_merge(f, o, n) for f, o, n in zip(functions, old, new, strict=True)]
            )
        self.partials.update_many(keys, after)
        if aggregation.event_column is not None:  # a new group is final once the watermark passes it
            for key, old in zip(batch.keys, before, strict=True):
                if old is None:
                    context.set_current_key(key)
                    context.register_timer(self._event_ms(key))
        if aggregation.mode != "update":
            return self._rows([], [])
        return self._rows(batch.keys, after)

    def handle_expired_timer(self, key: Any, expiry_ms: int, context: StateContext) -> list[dict[str, Any]]:
        """The watermark passed the group: emit it (append), and drop it."""
        partials = self.partials.value()
        self.partials.clear()
        if partials is None or self.aggregation.mode != "append":
            return []
        return [{name: values[0] for name, values in self._rows([key], [partials]).items()}]

    def _event_ms(self, key: Any) -> int:
        """The group's event time in ms, rounded up: the group is final when the watermark reaches it."""
        columns = self.aggregation.group_columns
        micros = key if len(columns) == 1 else key[columns.index(str(self.aggregation.event_column))]
        return -(-int(micros) // 1000)

    def _rows(self, keys: Sequence[Any], partials: Sequence[list[Any]]) -> dict[str, list[Any]]:
        """Output columns: the group columns, then each aggregate's result."""
        aggregation = self.aggregation
        columns = aggregation.group_columns
        output: dict[str, list[Any]] = {}
        for position, name in enumerate(columns):
            output[name] = [key if len(columns) == 1 else key[position] for key in keys]
        for position, aggregate in enumerate(aggregation.aggregates):
            output[aggregate.name] = [_result(aggregate.function, p[position]) for p in partials]
        return output


def aggregate_for(function: str, column: str | None, kind: Any) -> Aggregate:
    """The :class:`Aggregate` of Spark's ``function(column)`` over a column of Spark type ``kind``.

    :raises ConfigError: for a function dstl does not fold, or a column it cannot sum.
    """
    from pyspark.sql.types import DecimalType, IntegralType, NumericType

    spelled = function.lower()
    if spelled not in AGGREGATE_FUNCTIONS:
        msg = f"aggregate {function!r} after a dstl stateful step: use one of {sorted(AGGREGATE_FUNCTIONS)}"
        raise ConfigError(msg)
    canonical = AGGREGATE_FUNCTIONS[spelled]
    if column is None:
        return Aggregate("count", None, "count")
    if canonical in {"sum", "avg"} and (not isinstance(kind, NumericType) or isinstance(kind, DecimalType)):
        msg = f"{canonical}({column}) after a dstl stateful step needs a numeric column (not decimal): {kind}"
        raise ConfigError(msg)
    return Aggregate(canonical, column, f"{canonical}({column})", integral=isinstance(kind, IntegralType))


def result_type(aggregate: Aggregate, kind: Any) -> Any:
    """The Spark type of ``aggregate``'s column, as Spark types it (``kind``: the input column's)."""
    from pyspark.sql.types import DoubleType, LongType

    if aggregate.function == "count":
        return LongType()
    if aggregate.function == "avg":
        return DoubleType()
    if aggregate.function == "sum":
        return LongType() if aggregate.integral else DoubleType()
    return kind
