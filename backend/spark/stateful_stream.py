"""A stateful step as a stream to transform further and write with ``writeStream``, as on Spark.

.. code-block:: python

    totals = stateful_stream(events, key_columns=["user"], processor=RunningTotals,
                             output_schema="user string, total long")
    query = (
        totals.where("total > 100").withColumn("at", F.current_timestamp())
        .writeStream.format("parquet").outputMode("append")
        .option("checkpointLocation", "/data/chk").start("/data/big-spenders")
    )

The step runs in ``foreachBatch`` (:func:`~.query.transform_with_state`): per-row
steps (``select``, ``where``, ``withColumn``...) run on each batch's output; what
spans batches is another stateful step of the same query, with its own state:
``groupBy(...).count()``/``agg(...)`` (a streaming aggregation, in Spark's append or
update mode, on the query's watermark), or ``stateful_stream`` over this stream.
A join, a sort or anything else that spans batches is refused at the call, with
what to do instead. Formats: :func:`~._private.stream_sinks.batch_writer`.

.. code-block:: python

    sessions = stateful_stream(clicks, key_columns=["user"], processor=Sessions,
                               output_schema="user string, ended timestamp",
                               output_event_time_column="ended")
    per_minute = sessions.groupBy("ended").count()       # final once the watermark passes
    per_minute.writeStream.outputMode("append").option("checkpointLocation", chk).start(path)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dstl.spi import ConfigError

from ._private.aggregation import (
    EVENT_COPY_COLUMN,
    Aggregation,
    AggregationProcessor,
    aggregate_for,
    result_type,
)
from ._private.call_checks import output_struct
from ._private.query_start import StepRequest, start_query
from ._private.stream_sinks import OUTPUT_MODES, batch_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from .stateful_query import StatefulQuery

__all__ = ["GroupedStatefulStream", "StatefulStream", "StatefulStreamWriter", "stateful_stream"]

Step = Callable[["DataFrame"], "DataFrame"]

#: DataFrame operations that span rows of several batches (or need a stream of their own):
#: on a batch's output they would give per-batch answers, so they are refused.
_SPANNING = frozenset(
    {
        "agg", "crossJoin", "cube", "distinct", "dropDuplicates", "dropDuplicatesWithinWatermark",
        "exceptAll", "intersect", "intersectAll", "join", "limit", "orderBy",
        "rollup", "sort", "subtract", "transformWithState", "transformWithStateInPandas", "union",
        "unionAll", "unionByName", "withWatermark",
    }
)  # fmt: skip


def stateful_stream(frame: DataFrame | StatefulStream, **operator: Any) -> StatefulStream:
    """The output of a dstl stateful step over ``frame``, to transform and write like a DataFrame.

    :param frame: the stream, or another stateful step's output (both steps then run in
        one query, each with its own state, on the query's watermark).
    :param operator: the keywords of :func:`~.query.transform_with_state` that define the
        step (``key_columns``, ``processor``, ``output_schema``, ``time_mode``,
        ``event_time_column``, ``watermark_delay``, ``initial_state``, ``processor_api``,
        ``output_event_time_column``, ``config``, ``job_id``, ``operator_id``); the sink,
        checkpoint location, trigger and query name come from :attr:`StatefulStream.writeStream`.
    :raises ConfigError: for keywords that belong to ``writeStream``, or key columns the
        frame does not have.
    """
    given = set(operator) & {"sink", "checkpoint_location", "trigger", "query_name"}
    if given:
        msg = (
            f"{sorted(given)} belong to writeStream: format, option('checkpointLocation'), trigger, queryName"
        )
        raise ConfigError(msg)
    if "output_schema" not in operator or "key_columns" not in operator or "processor" not in operator:
        msg = "stateful_stream needs key_columns, processor and output_schema"
        raise ConfigError(msg)
    if isinstance(frame, StatefulStream):
        missing = [column for column in operator["key_columns"] if column not in frame.columns]
        if missing:
            msg = f"key columns {missing} are not in the stateful stream's columns {frame.columns}"
            raise ConfigError(msg)
        return StatefulStream(frame.source, dict(operator), upstream=frame)
    return StatefulStream(frame, dict(operator))


@dataclass(frozen=True)
class StatefulStream:
    """A stateful step's output and the per-row steps that follow it (immutable, like a DataFrame)."""

    source: DataFrame
    operator: Mapping[str, Any]
    steps: tuple[Step, ...] = ()
    #: the stateful step whose output (after its own steps) this one reads, in the same query
    upstream: StatefulStream | None = None
    #: per-row steps run on the upstream's output before this step (its input's shape)
    input_steps: tuple[Step, ...] = ()
    #: set when this step is ``groupBy(...).agg(...)``: its output mode is the query's
    aggregation: Aggregation | None = None
    _schema: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # the steps run on an empty frame of the output schema now: a wrong column fails at the call
        object.__setattr__(self, "_schema", self.apply(self.empty_output()).schema)

    def empty_output(self) -> DataFrame:
        """An empty batch frame of this step's output schema (before its steps)."""
        return self.source.sparkSession.createDataFrame([], output_struct(self.operator["output_schema"]))

    def apply(self, frame: DataFrame) -> DataFrame:
        """The steps, run on one batch's output."""
        for step in self.steps:
            frame = step(frame)
        return frame

    def read_input(self, upstream_output: DataFrame) -> DataFrame:
        """This step's input from its upstream's output of a batch (the upstream's steps, then ours)."""
        assert self.upstream is not None
        frame = self.upstream.apply(upstream_output)
        for step in self.input_steps:
            frame = step(frame)
        return frame

    def chain(self) -> list[StatefulStream]:
        """The query's stateful steps, the first (reading the stream) first."""
        steps = [self]
        while steps[0].upstream is not None:
            steps.insert(0, steps[0].upstream)
        return steps

    def request(self, output_mode: str) -> StepRequest:
        """This step as :func:`~._private.query_start.start_query` takes it, in ``output_mode``."""
        operator = dict(self.operator)
        if self.aggregation is not None:
            operator["processor"] = AggregationProcessor(self.aggregation.checked(output_mode))
        if self.upstream is None:
            return StepRequest(self.source, operator)
        upstream = self.upstream
        return StepRequest(self.read_input(upstream.empty_output()), operator, self.read_input)

    @property
    def output_event_time_column(self) -> str | None:
        """The column of the rows that carries the query's event time (``None``: none does)."""
        column = self.operator.get("output_event_time_column")
        return column if column in self.columns else None

    def groupBy(self, *columns: Any) -> GroupedStatefulStream:
        """Spark's ``groupBy`` on the stream: aggregate with ``count``, ``sum``... or ``agg``.

        :raises ConfigError: for a column this stream does not have, or a column
            expression (e.g. ``window``): group by column names.
        """
        names = (
            list(columns[0]) if len(columns) == 1 and isinstance(columns[0], list | tuple) else list(columns)
        )
        if not all(isinstance(name, str) for name in names):
            msg = (
                "groupBy after a dstl stateful step takes column names: compute a window or an "
                "expression as a column first (withColumn), then group by its name"
            )
            raise ConfigError(msg)
        missing = [name for name in names if name not in self.columns]
        if missing or not names:
            msg = f"groupBy{tuple(names)}: columns {missing} are not in the stream's columns {self.columns}"
            raise ConfigError(msg)
        return GroupedStatefulStream(self, tuple(names))

    groupby = groupBy

    def transform(self, step: Step) -> StatefulStream:
        """Add ``step`` (a DataFrame to DataFrame function run on each batch's output: keep it per-row)."""
        return replace(self, steps=(*self.steps, step))

    @property
    def schema(self) -> Any:
        """The rows' schema after the steps."""
        return self._schema

    @property
    def columns(self) -> list[str]:
        """The rows' columns after the steps."""
        return list(self._schema.fieldNames())

    def select(self, *columns: Any) -> StatefulStream:
        """``DataFrame.select`` on each batch's output."""
        return self.transform(lambda frame: frame.select(*columns))

    def selectExpr(self, *expressions: str) -> StatefulStream:
        """``DataFrame.selectExpr`` on each batch's output."""
        return self.transform(lambda frame: frame.selectExpr(*expressions))

    def where(self, condition: Any) -> StatefulStream:
        """``DataFrame.where`` on each batch's output."""
        return self.transform(lambda frame: frame.where(condition))

    filter = where

    def withColumn(self, name: str, column: Any) -> StatefulStream:
        """``DataFrame.withColumn`` on each batch's output."""
        return self.transform(lambda frame: frame.withColumn(name, column))

    def withColumns(self, columns: Mapping[str, Any]) -> StatefulStream:
        """``DataFrame.withColumns`` on each batch's output."""
        return self.transform(lambda frame: frame.withColumns(dict(columns)))

    def withColumnRenamed(self, existing: str, new: str) -> StatefulStream:
        """``DataFrame.withColumnRenamed`` on each batch's output."""
        return self.transform(lambda frame: frame.withColumnRenamed(existing, new))

    def drop(self, *columns: Any) -> StatefulStream:
        """``DataFrame.drop`` on each batch's output."""
        return self.transform(lambda frame: frame.drop(*columns))

    @property
    def writeStream(self) -> StatefulStreamWriter:
        """Spark's ``DataStreamWriter`` shape: format, outputMode, options, trigger, queryName, start."""
        return StatefulStreamWriter(self)

    def __getattr__(self, name: str) -> Any:
        if name in _SPANNING:
            msg = (
                f"{name}() after a dstl stateful step is not supported: the step runs batch by batch in "
                "foreachBatch, so it would see one batch's output, not the stream's. Do it in the "
                "stateful processor, or write this stream (e.g. to Kafka) and read it as a new stream"
            )
            raise ConfigError(msg)
        msg = f"{type(self).__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)


class StatefulStreamWriter:
    """Starts a :class:`StatefulStream` as a query (Spark's ``DataStreamWriter`` methods)."""

    def __init__(self, stream: StatefulStream) -> None:
        self._stream = stream
        self._format = "parquet"  # Spark's default source (spark.sql.sources.default)
        self._mode = "append"
        self._options: dict[str, str] = {}
        self._trigger: dict[str, Any] | None = None
        self._query_name: str | None = None
        self._function: Callable[[DataFrame, int], None] | None = None

    def format(self, source: str) -> StatefulStreamWriter:
        """The sink's format (see :func:`~._private.stream_sinks.batch_writer`)."""
        self._format = source
        return self

    def outputMode(self, mode: str) -> StatefulStreamWriter:
        """``append`` or ``update``: each row the processor returns is written once (Spark's rule here).

        :raises ConfigError: for ``complete``, which Spark refuses for this operator too.
        """
        if mode.lower() not in OUTPUT_MODES:
            msg = f"outputMode({mode!r}) is not supported by a stateful processor: use append or update"
            raise ConfigError(msg)
        self._mode = mode.lower()
        return self

    def option(self, key: str, value: Any) -> StatefulStreamWriter:
        """A sink option, or ``checkpointLocation``."""
        self._options[key] = str(value)
        return self

    def options(self, **options: Any) -> StatefulStreamWriter:
        """Several sink options."""
        for key, value in options.items():
            self.option(key, value)
        return self

    def trigger(self, **trigger: Any) -> StatefulStreamWriter:
        """``DataStreamWriter.trigger``'s keywords (``processingTime``, ``availableNow``, ``once``)."""
        self._trigger = trigger
        return self

    def queryName(self, name: str) -> StatefulStreamWriter:
        """The query's name (and the memory sink's table)."""
        self._query_name = name
        return self

    def foreachBatch(self, function: Callable[[DataFrame, int], None]) -> StatefulStreamWriter:
        """Write each batch with ``function(frame, batch_id)`` (it should overwrite a replayed batch)."""
        self._function = function
        self._format = "foreachBatch"
        return self

    def start(self, path: str | None = None) -> StatefulQuery:
        """Start the query.

        :raises ConfigError: without ``option("checkpointLocation", ...)`` (where the
            state and its offsets live), for a format that cannot write here, or an
            output mode an aggregation of the query cannot run in.
        """
        options = dict(self._options)
        checkpoint = options.pop("checkpointLocation", None)
        if checkpoint is None:
            msg = "a dstl stateful stream needs option('checkpointLocation', ...): its state lives there"
            raise ConfigError(msg)
        stream = self._stream
        session = stream.source.sparkSession
        write = self._function or batch_writer(self._format, options, path, self._query_name, session)

        def sink(frame: DataFrame, batch_id: int) -> None:
            write(stream.apply(frame), batch_id)

        return start_query(
            [step.request(self._mode) for step in stream.chain()],
            sink=sink,
            checkpoint_location=checkpoint,
            trigger=self._trigger,
            query_name=self._query_name,
        )


class GroupedStatefulStream:
    """A stateful stream grouped by columns (Spark's ``GroupedData``): each aggregate is the next step.

    The groups' running aggregates live in dstl's state; the mode chosen with
    ``writeStream.outputMode`` decides what each batch emits (``append``: a group once,
    final, when the watermark passes the query's event time among the group columns;
    ``update``: the groups a batch changed).
    """

    def __init__(self, stream: StatefulStream, columns: tuple[str, ...]) -> None:
        self._stream = stream
        self._columns = columns

    def count(self) -> StatefulStream:
        """Rows per group, in column ``count``."""
        return self._aggregated([("count", None)])

    def sum(self, *columns: str) -> StatefulStream:
        """``sum(column)`` per group, of each column (every numeric one when none is named)."""
        return self._aggregated([("sum", column) for column in self._numeric(columns)])

    def avg(self, *columns: str) -> StatefulStream:
        """``avg(column)`` per group."""
        return self._aggregated([("avg", column) for column in self._numeric(columns)])

    mean = avg

    def min(self, *columns: str) -> StatefulStream:
        """``min(column)`` per group."""
        return self._aggregated([("min", column) for column in self._numeric(columns)])

    def max(self, *columns: str) -> StatefulStream:
        """``max(column)`` per group."""
        return self._aggregated([("max", column) for column in self._numeric(columns)])

    def agg(self, *exprs: Any) -> StatefulStream:
        """Spark's ``agg`` in its mapping form: ``agg({"amount": "sum", "*": "count"})``.

        :raises ConfigError: for column expressions (``F.sum(...)``): use the mapping form
            or the named methods, then ``withColumnRenamed``.
        """
        if len(exprs) != 1 or not isinstance(exprs[0], Mapping):
            msg = (
                "agg after a dstl stateful step takes a mapping of column to function "
                "({'amount': 'sum', '*': 'count'}); rename results with withColumnRenamed"
            )
            raise ConfigError(msg)
        return self._aggregated(
            [(function, None if column == "*" else column) for column, function in exprs[0].items()]
        )

    def _numeric(self, columns: tuple[str, ...]) -> list[str]:
        from pyspark.sql.types import NumericType

        if columns:
            return list(columns)
        schema = self._stream.schema
        return [
            f.name
            for f in schema.fields
            if isinstance(f.dataType, NumericType) and f.name not in self._columns
        ]

    def _aggregated(self, wanted: list[tuple[str, str | None]]) -> StatefulStream:
        from pyspark.sql.types import StructField, StructType, TimestampNTZType, TimestampType

        stream = self._stream
        types = {f.name: f.dataType for f in stream.schema.fields}
        missing = [column for _, column in wanted if column is not None and column not in types]
        if missing or not wanted:
            msg = f"aggregate columns {missing} are not in the stream's columns {stream.columns}"
            raise ConfigError(msg)
        aggregates = tuple(
            aggregate_for(function, column, None if column is None else types[column])
            for function, column in wanted
        )
        timestamps = tuple(c for c in self._columns if isinstance(types[c], TimestampType | TimestampNTZType))
        event = stream.output_event_time_column
        event = event if event in self._columns else None
        fields = [StructField(c, _as_key_type(types[c]), True) for c in self._columns] + [
            StructField(a.name, result_type(a, None if a.column is None else types[a.column]), True)
            for a in aggregates
        ]
        operator = {
            "key_columns": list(self._columns),
            "processor": None,  # the aggregation's, in the query's output mode (request)
            "output_schema": StructType(fields),
            "time_mode": "event" if event else "none",
            "config": stream.operator.get("config"),
        }
        if event is not None:
            operator["event_time_column"] = EVENT_COPY_COLUMN
        aggregated = StatefulStream(
            stream.source,
            operator,
            upstream=stream,
            input_steps=(_as_keys(timestamps, event),),
            aggregation=Aggregation(self._columns, aggregates, event),
            steps=(_as_timestamps({c: types[c] for c in timestamps}),) if timestamps else (),
        )
        return aggregated


def _as_key_type(kind: Any) -> Any:
    """A group column's type in the aggregation's state: timestamps as epoch microseconds."""
    from pyspark.sql.types import LongType, TimestampNTZType, TimestampType

    return LongType() if isinstance(kind, TimestampType | TimestampNTZType) else kind


def _as_keys(timestamps: tuple[str, ...], event: str | None) -> Step:
    """The step before an aggregation: the event time kept as a timestamp, timestamp keys as microseconds."""

    def step(frame: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        if event is not None:
            frame = frame.withColumn(EVENT_COPY_COLUMN, F.col(event).cast("timestamp"))
        if timestamps:
            frame = frame.withColumns({c: F.unix_micros(F.col(c).cast("timestamp")) for c in timestamps})
        return frame

    return step


def _as_timestamps(kinds: Mapping[str, Any]) -> Step:
    """The step after an aggregation: its timestamp group columns back from microseconds."""

    def step(frame: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        return frame.withColumns({c: F.timestamp_micros(F.col(c)).cast(kind) for c, kind in kinds.items()})

    return step
