"""What ``transform_with_state`` checks and resolves at the call, before anything is written."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

from dstl.spi import STORAGE_OPTION, Config, ConfigError

from ..processor import StatefulProcessor
from .durations import duration_ms
from .input_chunks import InputChunks

__all__ = [
    "adapted",
    "check_columns",
    "check_storage_for_spark",
    "job_config",
    "output_struct",
    "stream_watermark",
]


def job_config(spark_conf: Any, config: Mapping[str, Any] | None, checkpoint_location: str) -> Config:
    """The Spark conf's ``spark.dstl.*``/``spark.state.*``, then ``config``; defaults under the checkpoint."""
    cfg = Config.from_spark_conf(spark_conf, extra=dict(config or {}))
    check_storage_for_spark(cfg)
    return cfg.under_checkpoint(checkpoint_location)


def check_storage_for_spark(cfg: Config) -> None:
    """Refuse storages that live in one process: Spark tasks run in separate Python workers.

    :raises UnknownStorageError: when the storage is not installed.
    :raises ConfigError: when it lacks the ``multi_process`` capability.
    """
    from dstl.spi.plugins import get_registry

    storage = cfg.get(STORAGE_OPTION)
    if "multi_process" not in get_registry().get(storage).capabilities:
        msg = (
            f"storage {storage!r} lives in one process, but Spark runs tasks in separate Python workers "
            "and a restarted driver is a new process: use local, filesystem, kafka or another storage "
            "with the 'multi_process' capability (dstl storages lists them)"
        )
        raise ConfigError(msg)


#: How a PySpark processor takes its rows: Spark's ``transformWithStateInPandas`` or ``transformWithState``.
PROCESSOR_APIS = ("pandas", "row")


def adapted(
    processor: Any, processor_api: str = "pandas", chunks: InputChunks | None = None
) -> Callable[[], StatefulProcessor]:
    """``processor`` as a factory of dstl processors, however the user gave it.

    A PySpark ``StatefulProcessor`` (class or instance) is wrapped, for the pandas or
    the row-based API as ``processor_api`` says; a dstl processor instance is copied
    for each task (Spark's idiom: each task runs its own copy); a dstl class or a
    zero-argument factory is used as it is. ``chunks``: Spark's Arrow batch limits, for
    a PySpark processor's input frames.

    :raises ConfigError: at the call, for anything else (or a factory that makes no
        processor), or ``processor_api="row"`` for a processor that is not PySpark's.
    """
    from ..pyspark_compat import is_pyspark_processor, pyspark_processor

    if processor_api not in PROCESSOR_APIS:
        msg = f"processor_api={processor_api!r} is none of {PROCESSOR_APIS}"
        raise ConfigError(msg)
    row_based = processor_api == "row"
    if is_pyspark_processor(processor):
        return pyspark_processor(processor, row_based=row_based, chunks=chunks)
    dstl_made: Callable[[], StatefulProcessor] | None = None
    if isinstance(processor, StatefulProcessor):
        dstl_made = functools.partial(copy.deepcopy, processor)
    elif isinstance(processor, type) and issubclass(processor, StatefulProcessor):
        dstl_made = processor
    elif callable(processor):
        made = processor()  # once, on the driver: a factory of something else fails here, not in a task
        if is_pyspark_processor(made):
            return pyspark_processor(made, row_based=row_based, chunks=chunks)
        if isinstance(made, StatefulProcessor):
            dstl_made = processor
    if dstl_made is not None and row_based:
        msg = (
            "processor_api='row' is for PySpark StatefulProcessors written for the row-based "
            f"transformWithState; {processor!r:.60} is dstl's (it takes processor_api='pandas')"
        )
        raise ConfigError(msg)
    if dstl_made is not None:
        return dstl_made
    msg = (
        f"processor {processor!r:.80} is not a StatefulProcessor: pass a dstl or PySpark StatefulProcessor "
        "subclass, an instance of one, or a zero-argument factory returning one"
    )
    raise ConfigError(msg)


#: The column metadata Spark's ``withWatermark`` sets on the event-time column.
_WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def stream_watermark(
    frame: Any,
    event_time_column: str | None,
    watermark_delay: str | float | None,
) -> tuple[str | None, int]:
    """The event-time column and watermark delay (ms): the caller's, else what the stream declares.

    ``frame.withWatermark("ts", "10 seconds")`` marks ``ts`` with its delay, as Spark's own
    operators read it: that column and delay are the defaults.

    :raises ConfigError: when the caller's delay or column contradicts the stream's
        watermark, or the stream declares several.
    """
    declared = {
        field.name: int(field.metadata[_WATERMARK_DELAY_KEY])
        for field in frame.schema.fields
        if _WATERMARK_DELAY_KEY in (field.metadata or {})
    }
    if len(declared) > 1:
        msg = f"the stream declares watermarks on several columns {sorted(declared)}: dstl follows one"
        raise ConfigError(msg)
    if event_time_column is None and declared:
        event_time_column = next(iter(declared))
    asked = None if watermark_delay is None else duration_ms(watermark_delay)
    if event_time_column is not None and declared and event_time_column not in declared:
        (column,) = declared
        msg = (
            f"event_time_column={event_time_column!r}, but the stream's watermark is on {column!r} "
            f"(withWatermark): use {column!r}, or drop withWatermark"
        )
        raise ConfigError(msg)
    stream_delay = declared.get(event_time_column) if event_time_column is not None else None
    if asked is not None and stream_delay is not None and asked != stream_delay:
        msg = (
            f"watermark_delay={watermark_delay!r} ({asked} ms) contradicts the stream's withWatermark "
            f"delay of {stream_delay} ms on {event_time_column!r}: leave watermark_delay unset (the "
            "stream's is used) or change withWatermark"
        )
        raise ConfigError(msg)
    return event_time_column, asked if asked is not None else (stream_delay or 0)


def check_columns(frame: Any, key_columns: list[str], event_time_column: str | None) -> None:
    """Refuse at the call what the first batch would fail on: columns the stream does not have."""
    columns = list(frame.columns)
    wanted = [*key_columns, *([event_time_column] if event_time_column else [])]
    missing = [column for column in wanted if column not in columns]
    if not key_columns or missing:
        msg = (
            f"the stream has no column {missing[0]!r} (its columns: {columns})"
            if missing
            else "key_columns is empty: name the columns that key the state"
        )
        raise ConfigError(msg)


def output_struct(output_schema: Any) -> Any:
    """``output_schema`` as a ``StructType`` (given as one or as a DDL string)."""
    from pyspark.sql.types import StructType

    return output_schema if isinstance(output_schema, StructType) else StructType.fromDDL(output_schema)
