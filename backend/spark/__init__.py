"""Run the changelog state backend inside PySpark Structured Streaming.

:func:`transform_with_state` starts a query whose per-key state (Value, List, Map,
Reducing) lives in the changelog backend, with the storage chosen by
``spark.dstl.storage`` (``local``, ``filesystem``, ``kafka`` or a plugin):

.. code-block:: python

    query = transform_with_state(
        events,
        key_columns=["user"],
        processor=RunningTotals,            # a StatefulProcessor subclass
        output_schema="user string, total long",
        sink="/data/out",                   # or (DataFrame, batch_id) -> None
        checkpoint_location="/data/chk",
    )
    query.add_listener(print)               # BatchProgress after every batch
    query.last_progress.to_json()           # Spark's lastProgress with a "dstl" section

:func:`stateful_stream` gives the same step as a stream to transform further
(``select``, ``where``, ``withColumn``...) and write with Spark's ``writeStream``
shape (``format``, ``outputMode``, ``option``, ``trigger``, ``queryName``, ``start``).

Timers (``context.register_timer``, fired through ``handle_expired_timer``) follow
``time_mode``: processing time, or event time with ``event_time_column`` and
``watermark_delay`` (Spark's watermark rule, checkpointed). An unmodified PySpark
``StatefulProcessor`` runs as it is (:mod:`.pyspark_compat`).

Needs ``pip install 'dstl[spark]'``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._private.working_copy import wait_for_snapshots
    from .placement import instance_for_key_group, routing_exprs
    from .processor import BatchClock, StateContext, StatefulProcessor, TimeMode
    from .progress import BatchProgress
    from .prometheus import PrometheusExporter
    from .pyspark_compat import PySparkProcessor, pyspark_processor
    from .query import StatefulQuery, transform_with_state
    from .query_progress import QueryProgress
    from .sinks import DirectoryPerBatchSink, ParquetBatchSink
    from .state_reader import read_changes, read_state
    from .state_variables import read_state_metadata, read_state_variable
    from .stateful_stream import StatefulStream, stateful_stream

#: public name -> its module: imported on first use, so that importing a module of this package
#: (its options, for one) does not import PySpark.
_LAZY = {
    "BatchClock": ".processor",
    "BatchProgress": ".progress",
    "DirectoryPerBatchSink": ".sinks",
    "ParquetBatchSink": ".sinks",
    "PrometheusExporter": ".prometheus",
    "PySparkProcessor": ".pyspark_compat",
    "QueryProgress": ".query_progress",
    "StateContext": ".processor",
    "StatefulProcessor": ".processor",
    "StatefulQuery": ".query",
    "StatefulStream": ".stateful_stream",
    "TimeMode": ".processor",
    "instance_for_key_group": ".placement",
    "pyspark_processor": ".pyspark_compat",
    "read_changes": ".state_reader",
    "read_state": ".state_reader",
    "read_state_metadata": ".state_variables",
    "read_state_variable": ".state_variables",
    "routing_exprs": ".placement",
    "stateful_stream": ".stateful_stream",
    "transform_with_state": ".query",
    "wait_for_snapshots": "._private.working_copy",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "BatchClock",
    "BatchProgress",
    "DirectoryPerBatchSink",
    "ParquetBatchSink",
    "PrometheusExporter",
    "PySparkProcessor",
    "QueryProgress",
    "StateContext",
    "StatefulProcessor",
    "StatefulQuery",
    "StatefulStream",
    "TimeMode",
    "instance_for_key_group",
    "pyspark_processor",
    "read_changes",
    "read_state",
    "read_state_metadata",
    "read_state_variable",
    "routing_exprs",
    "stateful_stream",
    "transform_with_state",
    "wait_for_snapshots",
]
