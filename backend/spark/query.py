"""Driver side: run a stateful processor over a streaming DataFrame with the changelog backend.

Each micro-batch (``foreachBatch``):

1. checkpoint ``batch_id - 1`` is the base (a replayed batch drops anything newer);
2. rows are routed by key group to their operator instance (stable placement) and
   every instance with rows runs as one ``applyInPandas`` group: warm working copy
   or restore, the processor, persist → its snapshot;
3. the result is pinned with ``localCheckpoint`` so the processor never runs twice
   for one attempt, the rows go to the sink, and only then checkpoint ``batch_id``
   is completed (instances without rows carry their snapshot forward).

Spark's own checkpoint location tracks the source offsets; a batch replayed after
a crash restarts from checkpoint ``batch_id - 1``, so state and sink are exactly once
as long as the sink overwrites a replayed batch (:class:`ParquetBatchSink` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dstl.spi import ConfigError

from ._private.call_checks import (
    adapted,
    check_columns,
    check_storage_for_spark,
    job_config,
    output_struct,
    stream_watermark,
)
from ._private.idle_batches import NO_DATA_BATCHES_CONF, wants_idle_batches, with_heartbeat
from ._private.input_chunks import InputChunks
from ._private.ledgers import BatchLedger, RecordedLedger, RunnerLedger
from ._private.listener_hub import hub_of
from ._private.query_record import QueryShape, key_types, settled_shape
from ._private.runner import BatchRunner, QuerySpec, Sink, checked_layout
from ._private.server_runner import ProgressRecords, ServerSideRunner
from ._private.sessions import connect_config, is_connect, spark_conf
from .job_identity import resolve_job_id
from .processor import StatefulProcessor, TimeMode
from .pyspark_compat import PySparkProcessorFactory
from .query_progress import ProgressBridge
from .sinks import ParquetBatchSink
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
    """
    event_time_column, delay_ms = stream_watermark(frame, event_time_column, watermark_delay)
    check_columns(frame, key_columns, event_time_column)  # before anything is written
    spark = frame.sparkSession
    processor = adapted(processor, processor_api, InputChunks.of(spark))
    connect = is_connect(spark)
    cfg = job_config(spark_conf(spark), config, checkpoint_location)
    if connect:
        cfg = connect_config(cfg, initial_state)
    parallelism, _, state_dir = checked_layout(cfg)
    job_id = resolve_job_id(checkpoint_location, job_id, cfg, legacy_state_dir=state_dir)
    schema = output_struct(output_schema)
    mode = TimeMode.parse(time_mode if time_mode is not None else ("event" if event_time_column else "none"))
    if mode is TimeMode.EVENT and event_time_column is None:
        msg = "time_mode='event' needs an event_time_column (the watermark follows it)"
        raise ConfigError(msg)
    no_data_batches = str(spark.conf.get(NO_DATA_BATCHES_CONF, "true")).strip().lower() == "true"
    wanted = QueryShape(
        key_types(frame, key_columns),
        mode.value,
        wants_idle_batches(mode, trigger, no_data_batches=no_data_batches),
        processor.schemas if isinstance(processor, PySparkProcessorFactory) else {},
        state_kinds=processor.state_kinds if isinstance(processor, PySparkProcessorFactory) else {},
        expiring_states=processor.expiring_states
        if isinstance(processor, PySparkProcessorFactory)
        else frozenset(),
    )
    settled = settled_shape(checkpoint_location, wanted, cfg)
    heartbeat = settled.idle_batches
    if isinstance(processor, PySparkProcessorFactory):  # values name the schema they were written with
        processor = replace(
            processor, value_versions={name: settled.versions_of(name) for name in processor.schemas}
        )
    declared = processor.state_counts if isinstance(processor, PySparkProcessorFactory) else {}
    spec = QuerySpec(
        job_id,
        operator_id,
        tuple(key_columns),
        schema,
        processor,
        ParquetBatchSink(sink) if isinstance(sink, str) else sink,
        mode,
        event_time_column,
        delay_ms,
        initial_state,
        heartbeat,
    )
    function: Sink
    ledger: BatchLedger
    if connect:  # the runner is built where Connect runs the function: on the server
        function = ServerSideRunner(cfg, spec)
        bridge = ProgressBridge(ProgressRecords(state_dir, job_id, cfg).read, parallelism, declared)
        ledger = RecordedLedger(bridge, state_dir, job_id, cfg)
    else:
        runner = BatchRunner(cfg, spec)
        function, ledger = runner, RunnerLedger(runner)
        bridge = ProgressBridge(runner.progress_of, parallelism, declared)
    source = with_heartbeat(frame) if heartbeat else frame
    writer = source.writeStream.foreachBatch(function).option("checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    hub = hub_of(spark)
    hub.join(bridge)
    try:
        query = writer.start()
    except BaseException:
        hub.leave(bridge)
        raise
    bridge.bind(str(query.id), lambda: hub.leave(bridge))
    return StatefulQuery(ledger, query, bridge, lambda: hub.leave(bridge))
