"""Routing a batch's rows to their operator instances: key group, instance and event-time columns."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from dstl.spi import ConfigError

from ..placement import routing_exprs
from .columns import EVENT_TIME_COLUMN, INSTANCE_COLUMN, KEY_GROUP_COLUMN, WAKE_KEY_GROUP

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["RoutingColumns", "instance_partition", "routed", "with_wake_rows"]


class RoutingColumns:
    """A query's routing expressions, each built into a Column once and reused every batch.

    Building a Column per batch cost round trips to the JVM (py4j) on the batch's
    critical path: about 8 ms of a batch's plan. A Column holds an unresolved
    expression, so one serves every batch's DataFrame; it is built at first use, in
    the process that runs the batches (a Connect server's, not the client's).
    """

    def __init__(self, key_columns: tuple[str, ...], parallelism: int, max_parallelism: int) -> None:
        self.key_columns = key_columns
        self.parallelism = parallelism
        self.key_group_sql, self.instance_sql = routing_exprs(list(key_columns), parallelism, max_parallelism)

    @cached_property
    def key_group(self) -> Column:
        """A row's key group."""
        from pyspark.sql import functions as F

        return F.expr(self.key_group_sql)

    @cached_property
    def instance(self) -> Column:
        """A row's operator instance."""
        from pyspark.sql import functions as F

        return F.expr(self.instance_sql)

    @cached_property
    def partition_key(self) -> Column:
        """What sends instance ``i``'s rows to partition ``i`` of the JVM shuffle (``instance_shuffled``)."""
        from pyspark.sql import functions as F

        from .arrow_shuffle import instance_partition_key  # the shuffle's module runs instances: imports this

        return F.expr(instance_partition_key(self.parallelism))


def instance_partition(instance: int) -> int:
    """The partition of an instance's rows with sticky placement: its own index."""
    return instance


def routed(frame: DataFrame, routing: RoutingColumns, event_time_column: str | None) -> DataFrame:
    """``frame`` with its key group and instance columns (and event time in ms), in one projection.

    Key columns are widened first to the types the Python key hash mirrors (bigint, double).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType, FloatType, IntegerType, ShortType, TimestampNTZType, TimestampType

    key_columns = routing.key_columns
    fields = frame.schema.fields
    names = {field.name for field in fields}
    missing = [c for c in key_columns if c not in names]
    if missing:
        msg = f"key columns {missing} are not in the stream's columns {sorted(names)}"
        raise ConfigError(msg)
    widened = {}
    for field in fields:
        if field.name in key_columns:
            if isinstance(field.dataType, ByteType | ShortType | IntegerType):
                widened[field.name] = F.col(field.name).cast("bigint")
            elif isinstance(field.dataType, FloatType):
                widened[field.name] = F.col(field.name).cast("double")
    if widened:
        frame = frame.withColumns(widened)
    added = {KEY_GROUP_COLUMN: routing.key_group, INSTANCE_COLUMN: routing.instance}
    if event_time_column is not None:
        types = {field.name: field.dataType for field in fields}
        if event_time_column not in types:
            msg = f"event_time_column {event_time_column!r} is not in the stream's columns {sorted(names)}"
            raise ConfigError(msg)
        if isinstance(types[event_time_column], TimestampType | TimestampNTZType):
            # in Spark, not pandas: pandas would see local wall-clock times without their zone
            event_ms = F.floor(F.unix_micros(F.col(event_time_column).cast("timestamp")) / 1000)
        else:  # a number of epoch milliseconds
            event_ms = F.col(event_time_column).cast("bigint")
        added[EVENT_TIME_COLUMN] = event_ms.cast("bigint")
    return frame.withColumns(added)


def with_wake_rows(routed: DataFrame, wake: frozenset[int]) -> DataFrame:
    """``routed`` plus one data-less row per instance in ``wake``, so that its task runs (timers are due)."""
    if not wake:
        return routed
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, ByteType, IntegerType, LongType, ShortType

    spark = routed.sparkSession
    marks = spark.createDataFrame([(index,) for index in sorted(wake)], f"{INSTANCE_COLUMN} int")
    columns = []
    for field in routed.schema.fields:
        if field.name == INSTANCE_COLUMN:
            columns.append(F.col(INSTANCE_COLUMN))
        elif field.name == KEY_GROUP_COLUMN:
            columns.append(F.lit(WAKE_KEY_GROUP).cast(field.dataType).alias(field.name))
        elif isinstance(field.dataType, ByteType | ShortType | IntegerType | LongType | BooleanType):
            # not null: a null would make pandas turn the instance's int (bool) column into floats (objects)
            columns.append(F.lit(0).cast(field.dataType).alias(field.name))
        else:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
    return routed.unionByName(marks.select(columns))
