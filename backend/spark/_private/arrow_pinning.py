"""Sticky placement with the rows as Arrow, both ways: no pickled ``Row`` crosses to or from Python.

1. The routed batch leaves the JVM as Arrow record batches (``toArrowBatchRdd``);
   each is split by instance, vectorized, into one Arrow IPC stream per instance
   present in it, and the streams are shuffled to their instance's partition
   (:func:`arrow_groups`, bytes only).
2. Those partitions are zipped with one preferring its instance's home executor
   (:func:`~.affinity.pinned_instances`) and become a DataFrame of one row per
   instance: its index and its streams.
3. ``mapInArrow`` runs each instance there (a narrow step: the partition keeps its
   preferred location) and returns the output and the report as Arrow
   (:func:`pinned_arrow_function`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..processor import StatefulProcessor
from .affinity import arrow_batches
from .columns import INSTANCE_COLUMN
from .instance_rows import ArrowRows, InstanceRows, PandasRows
from .kept_output import KeptKey, keep_output, kept_output
from .output import output_batch
from .protocol import TaskPlan
from .report_channel import ReportSender, TaskReports, reporting
from .routing import instance_partition
from .standby import finish_refreshes, keep_copies
from .task import process_instance, working_copy_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["CARRIER_SCHEMA", "arrow_groups", "pinned_arrow_function", "run_instance"]

#: One row per instance: its index and its rows as Arrow IPC streams.
CARRIER_SCHEMA = f"{INSTANCE_COLUMN} int, streams array<binary>"


def arrow_groups(rows: DataFrame, parallelism: int, timezone: str) -> Any:
    """The routed rows as an RDD of one partition per instance, each one element: its IPC streams.

    The JVM converts the rows to Arrow; Python splits each record batch by instance
    (vectorized) and only bytes are shuffled.

    :param timezone: Spark's session time zone (the JVM's Arrow timestamps carry it).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(rows.schema, timezone=timezone)
    batches = arrow_batches(rows)

    def split(messages: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for message in messages:
            batch = pa.ipc.read_record_batch(pa.py_buffer(message), schema)
            instances = batch.column(INSTANCE_COLUMN)
            for instance in pc.unique(instances).to_pylist():
                yield instance, _ipc_stream(batch.filter(pc.equal(instances, instance)))

    return batches.mapPartitions(split).partitionBy(parallelism, instance_partition).values().glom()


def _ipc_stream(batch: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _rows(streams: list[bytes], timezone: str) -> ArrowRows:
    """An instance's rows, from its IPC streams, as one Arrow table (pandas only when read)."""
    import pyarrow as pa

    table = pa.concat_tables(pa.ipc.open_stream(pa.py_buffer(stream)).read_all() for stream in streams)
    return ArrowRows(table, timezone)


def pinned_arrow_function(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    columns: tuple[str, ...],
    timezone: str,
    sender: ReportSender | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of sticky placement: carrier rows in, output and report rows out.

    :param columns: the routed rows' columns (an instance woken without rows gets none of them).
    :param timezone: Spark's session time zone (``spark.sql.session.timeZone``).
    :param sender: where the task also sends its reports (:mod:`.report_channel`).
    """

    def process(carriers: Iterator[Any], reports: TaskReports) -> Iterator[Any]:
        for carrier in carriers:
            instances = carrier.column(INSTANCE_COLUMN).to_pylist()
            for instance, streams in zip(instances, carrier.column("streams").to_pylist(), strict=True):
                if streams or instance in plan.wake:  # else its snapshot carries forward (driver side)
                    began = time.perf_counter()
                    rows = _rows(streams, timezone) if streams else _empty(columns)
                    decode_ms = round((time.perf_counter() - began) * 1000, 3)
                    yield from run_instance(
                        plan, make_processor, instance, rows, timezone, decode_ms, reports
                    )
                elif plan.standbys.get(instance):  # no rows here (or a standby-only task): the copies
                    keep_copies(plan, plan.standbys[instance], reports.copies)
                    finish_refreshes(plan, instance)

    return reporting(process, sender)


def _empty(columns: tuple[str, ...]) -> PandasRows:
    import pandas as pd

    return PandasRows(pd.DataFrame(columns=list(columns)))


def run_instance(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    instance: int,
    rows: InstanceRows,
    timezone: str,
    decode_ms: float,
    reports: TaskReports,
) -> Iterator[Any]:
    """One instance's batch: its output rows, then the row carrying its report (both as Arrow).

    The report, encoded, is also noted in ``reports``. With ``plan.keep_output``, a
    task that runs the batch again (a further action over the output) replays what
    the first one returned (:mod:`.kept_output`). Then the standby copies the plan
    gives this instance's executor are refreshed in the background (:mod:`.standby`).
    """
    copy = working_copy_of(plan, instance)
    key = KeptKey.of(plan, instance)
    with copy.exclusive():  # no other attempt runs the batch between the check and the keeping
        kept = kept_output(copy.path, key, output_batch({}, plan.output_schema, timezone).schema)
        if kept is None:
            output, report = process_instance(plan, make_processor, rows, instance)
            encoding = time.perf_counter()
            batches = [output_batch(output, plan.output_schema, timezone)]
            phases = {
                "decode": decode_ms,
                **report.stats.phases_ms,
                "encode": round((time.perf_counter() - encoding) * 1000, 3),
            }
            encoded = replace(report, stats=replace(report.stats, phases_ms=phases)).to_json()
            if plan.keep_output:
                keep_output(copy.path, key, batches, encoded)
        else:
            batches, encoded = kept
    if plan.standbys.get(instance):  # after this instance's work, in the worker's background
        keep_copies(plan, plan.standbys[instance], reports.copies)
    reports.instances.append(encoded)
    yield from batches
    yield output_batch({}, plan.output_schema, timezone, report=encoded)
    if plan.standbys.get(instance):  # the output is on its way meanwhile
        finish_refreshes(plan, instance)
