"""A stateful step as a stream to transform further and write with ``writeStream``, as on Spark.

.. code-block:: python

    totals = stateful_stream(events, key_columns=["user"], processor=RunningTotals,
                             output_schema="user string, total long")
    query = (
        totals.where("total > 100").withColumn("at", F.current_timestamp())
        .writeStream.format("parquet").outputMode("append")
        .option("checkpointLocation", "/data/chk").start("/data/big-spenders")
    )

The step runs in ``foreachBatch`` (:func:`~.query.transform_with_state`): what
follows it runs on each batch's output, so only per-row steps may follow
(``select``, ``where``, ``withColumn``...); an aggregation, a join, a second
stateful step or anything else that spans batches is refused at the call, with
what to do instead. Formats: :func:`~._private.stream_sinks.batch_writer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dstl.spi import ConfigError

from ._private.call_checks import output_struct
from ._private.stream_sinks import OUTPUT_MODES, batch_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from .stateful_query import StatefulQuery

__all__ = ["StatefulStream", "StatefulStreamWriter", "stateful_stream"]

Step = Callable[["DataFrame"], "DataFrame"]

#: DataFrame operations that span rows of several batches (or need a stream of their own):
#: on a batch's output they would give per-batch answers, so they are refused.
_SPANNING = frozenset(
    {
        "agg", "crossJoin", "cube", "distinct", "dropDuplicates", "dropDuplicatesWithinWatermark",
        "exceptAll", "groupBy", "groupby", "intersect", "intersectAll", "join", "limit", "orderBy",
        "rollup", "sort", "subtract", "transformWithState", "transformWithStateInPandas", "union",
        "unionAll", "unionByName", "withWatermark",
    }
)  # fmt: skip


def stateful_stream(frame: DataFrame, **operator: Any) -> StatefulStream:
    """The output of a dstl stateful step over ``frame``, to transform and write like a DataFrame.

    :param operator: the keywords of :func:`~.query.transform_with_state` that define the
        step (``key_columns``, ``processor``, ``output_schema``, ``time_mode``,
        ``event_time_column``, ``watermark_delay``, ``initial_state``, ``processor_api``,
        ``config``, ``job_id``, ``operator_id``); the sink, checkpoint location, trigger
        and query name come from :attr:`StatefulStream.writeStream`.
    :raises ConfigError: when ``frame`` is itself a stateful stream (one dstl step per query).
    """
    if isinstance(frame, StatefulStream):
        msg = (
            "one dstl stateful step per query: a second one over a stateful stream is not supported yet; "
            "write the first step's output (e.g. to Kafka or files) and run the second as its own query"
        )
        raise ConfigError(msg)
    given = set(operator) & {"sink", "checkpoint_location", "trigger", "query_name"}
    if given:
        msg = (
            f"{sorted(given)} belong to writeStream: format, option('checkpointLocation'), trigger, queryName"
        )
        raise ConfigError(msg)
    if "output_schema" not in operator or "key_columns" not in operator or "processor" not in operator:
        msg = "stateful_stream needs key_columns, processor and output_schema"
        raise ConfigError(msg)
    return StatefulStream(frame, dict(operator))


@dataclass(frozen=True)
class StatefulStream:
    """A stateful step's output and the per-row steps that follow it (immutable, like a DataFrame)."""

    source: DataFrame
    operator: Mapping[str, Any]
    steps: tuple[Step, ...] = ()
    _schema: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # the steps run on an empty frame of the output schema now: a wrong column fails at the call
        object.__setattr__(self, "_schema", self.apply(self._empty_output()).schema)

    def _empty_output(self) -> DataFrame:
        return self.source.sparkSession.createDataFrame([], output_struct(self.operator["output_schema"]))

    def apply(self, frame: DataFrame) -> DataFrame:
        """The steps, run on one batch's output."""
        for step in self.steps:
            frame = step(frame)
        return frame

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
            state and its offsets live), or for a format that cannot write here.
        """
        from .query import transform_with_state

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

        return transform_with_state(
            stream.source,
            **stream.operator,
            sink=sink,
            checkpoint_location=checkpoint,
            trigger=self._trigger,
            query_name=self._query_name,
        )
