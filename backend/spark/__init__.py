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

Needs ``pip install 'dstl[spark]'``.
"""

from __future__ import annotations

from .placement import instance_for_key_group, routing_exprs
from .processor import StateContext, StatefulProcessor
from .progress import BatchProgress
from .query import StatefulQuery, transform_with_state
from .sinks import ParquetBatchSink

__all__ = [
    "BatchProgress",
    "ParquetBatchSink",
    "StateContext",
    "StatefulProcessor",
    "StatefulQuery",
    "instance_for_key_group",
    "routing_exprs",
    "transform_with_state",
]
