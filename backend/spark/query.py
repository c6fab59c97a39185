"""Driver side: run a stateful processor over a streaming DataFrame with the changelog backend.

Each micro-batch (``foreachBatch``):

1. checkpoint ``batch_id - 1`` is the base (a replayed batch drops anything newer);
2. rows are routed by key group to their operator instance (stable placement) and
   every instance with rows runs as one ``applyInPandas`` group: warm working copy
   or restore, the processor, persist → its snapshot;
3. the rows go to the sink, and only then checkpoint ``batch_id`` is completed
   (instances without rows carry their snapshot forward). The processor never runs
   twice for one attempt: a further action over the output replays what each
   instance kept of it, or reads a ``localCheckpoint``-ed result where the reports
   are collected before the sink.

Spark's own checkpoint location tracks the source offsets; a batch replayed after
a crash restarts from checkpoint ``batch_id - 1``, so state and sink are exactly once
as long as the sink overwrites a replayed batch (:class:`ParquetBatchSink` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._private.call_checks import check_storage_for_spark, stream_watermark
from ._private.query_start import StepRequest, start_query
from ._private.runner import Sink
from .processor import StatefulProcessor, TimeMode
from .stateful_query import StatefulQuery

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["StatefulQuery", "check_storage_for_spark", "stream_watermark", "transform_with_state"]


def transform_with_state(  # noqa: PLR0913 - the keywords of PySpark's transformWithStateInPandas
    frame: DataFrame,
    *,
    key_columns: list[str],
    processor: Callable[[], StatefulProcessor],
    output_schema: Any,
    sink: Sink | str,
    checkpoint_location: str,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
    operator_id: str = "stateful",
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    time_mode: str | TimeMode | None = None,
    event_time_column: str | None = None,
    watermark_delay: str | float | None = None,
    initial_state: DataFrame | None = None,
    processor_api: str = "pandas",
    output_event_time_column: str | None = None,
) -> StatefulQuery:
    """Start a streaming query whose per-key state lives in the changelog backend.

    :param processor: a :class:`StatefulProcessor` (or PySpark ``StatefulProcessor``)
        subclass, an instance of one (each task runs its own copy, as in Spark) or a
        zero-argument factory; one is created per operator instance and batch on the
        executors. Anything else, and key or event-time columns the stream lacks, is a
        :class:`ConfigError` at the call, before anything is written.
    :param output_schema: the rows ``handle_input_rows`` returns (columns nullable).
    :param sink: ``(DataFrame, batch_id) -> None`` that overwrites a replayed batch,
        or a path for :class:`ParquetBatchSink`.
    :param checkpoint_location: Spark's checkpoint (source offsets); state checkpoints
        and the ``local`` storage default to directories under it.
    :param job_id: names the job's logs and working copies on the storage. By default
        derived from ``checkpoint_location``; whatever id a location starts with is
        recorded in it and kept (another id later is refused), and another location
        claiming the same id on the same storage is refused at start.
    :param config: ``dstl.*``/``state.*`` keys on top of the Spark conf's ``spark.dstl.*``/``spark.state.*``.
    :param trigger: keyword arguments of ``DataStreamWriter.trigger``
        (e.g. ``{"availableNow": True}``).
    :param time_mode: the clock of the processor's timers: ``processing``, ``event``
        or ``none`` (PySpark's spellings too); by default ``event`` with an
        ``event_time_column``, else ``none``.
    :param event_time_column: a timestamp column, or one of epoch milliseconds: the
        watermark follows it, and rows at or below the watermark are dropped as late.
        As on Spark, with timers (processing or event time) a batch runs on an idle
        stream too, at least every second or trigger interval: due timers fire and a
        moved watermark takes effect without new rows (not with ``availableNow``/``once``,
        nor with ``spark.sql.streaming.noDataMicroBatches.enabled=false``).
    :param watermark_delay: how far the watermark trails the largest event time seen
        (milliseconds, or a duration such as ``"10 seconds"``). By default the delay the
        stream declares with ``withWatermark`` on the event-time column (whose column is
        then the default ``event_time_column``), else 0; a different one is refused. As in Spark, a batch
        uses the watermark of the batches before it; the watermark is checkpointed.
    :param initial_state: a DataFrame with the key columns, handed key by key to
        :meth:`StatefulProcessor.handle_initial_state` in the query's first batch.
    :param processor_api: for a PySpark processor, the API it was written for:
        ``"pandas"`` (``transformWithStateInPandas``: frames in and out) or ``"row"``
        (the row-based ``transformWithState``: ``Row`` objects in and out, initial
        state one ``Row`` at a time).
    :param output_event_time_column: the output column that carries event time (PySpark's
        ``eventTimeColumnName``): a later step of the query (e.g. ``groupBy(...).count()``
        in append mode) follows the query's watermark on it.
    """
    operator = {
        "key_columns": key_columns,
        "processor": processor,
        "output_schema": output_schema,
        "config": config,
        "job_id": job_id,
        "operator_id": operator_id,
        "time_mode": time_mode,
        "event_time_column": event_time_column,
        "watermark_delay": watermark_delay,
        "initial_state": initial_state,
        "processor_api": processor_api,
        "output_event_time_column": output_event_time_column,
    }
    return start_query(
        [StepRequest(frame, operator)],
        sink=sink,
        checkpoint_location=checkpoint_location,
        trigger=trigger,
        query_name=query_name,
    )
