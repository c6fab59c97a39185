"""Placement with nothing to pin to: the JVM shuffles the rows to their instance, Arrow both ways.

With no executor but the driver's (``local[N]``), or none registered yet, every task
runs in one place and sticky placement has nothing to keep warm; its path (rows to
Python and back as bytes, zipped with a pinned RDD) then only costs. This one is
the floor's shape: one JVM shuffle, by a partition key that sends instance ``i``'s
rows to partition ``i``, then one ``mapInArrow`` that runs the instances of each
partition on their rows (usually one; several only if a partition is shared).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..processor import StatefulProcessor
from .arrow_pinning import run_instance
from .columns import INSTANCE_COLUMN
from .instance_rows import ArrowRows
from .protocol import TaskPlan
from .report_channel import ReportSender, TaskReports, reporting

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["instance_partition_key", "instance_shuffled", "shuffled_arrow_function", "spark_partition_keys"]

_MASK = 0xFFFFFFFF
#: Spark's default seed of ``hash()`` and of hash partitioning (``Murmur3Hash``).
_SPARK_HASH_SEED = 42


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int) -> int:
    """Spark SQL's ``hash(value)`` of an ``int`` (Murmur3 x86 32-bit, seed 42), signed."""
    k1 = _rotl((value & _MASK) * 0xCC9E2D51 & _MASK, 15) * 0x1B873593 & _MASK
    h1 = (_rotl(_SPARK_HASH_SEED ^ k1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & _MASK
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@functools.lru_cache(maxsize=16)
def spark_partition_keys(partitions: int) -> tuple[int, ...]:
    """For each partition ``i`` of a hash repartition into ``partitions``, an ``int`` Spark sends there.

    Hash partitioning puts a row in ``pmod(hash(key), partitions)``: repartitioning by
    these keys (the instance's, looked up) gives instance ``i`` partition ``i`` alone.
    """
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < partitions:
        keys.setdefault(spark_hash_int(candidate) % partitions, candidate)
        candidate += 1
    return tuple(keys[i] for i in range(partitions))


def instance_partition_key(parallelism: int) -> str:
    """The Spark SQL expression whose hash partitioning sends instance ``i``'s rows to partition ``i``."""
    keys = ", ".join(str(key) for key in spark_partition_keys(parallelism))  # int literals, as hashed
    # one expression the JVM parses at once: a batch's planning pays per Column built through py4j
    return f"element_at(array({keys}), {INSTANCE_COLUMN} + 1)"


def instance_shuffled(rows: DataFrame, parallelism: int, partition_key: Column) -> DataFrame:
    """``rows`` in ``parallelism`` partitions, instance ``i``'s all in partition ``i`` (a JVM shuffle).

    :param partition_key: :func:`instance_partition_key` as a Column (built once per query).
    """
    return rows.repartition(parallelism, partition_key)


def shuffled_arrow_function(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    timezone: str,
    sender: ReportSender | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function over :func:`instance_shuffled` rows: each instance present runs.

    An instance whose timers are due has a wake row (``with_wake_rows``), so its
    partition holds it even in a batch without its data (the task drops it, as on
    every placement). ``sender``: where the task also sends its reports (:mod:`.report_channel`).
    """

    def process(batches: Iterator[Any], reports: TaskReports) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        began = time.perf_counter()
        received = list(batches)
        if not received or not any(batch.num_rows for batch in received):
            return
        table = pa.Table.from_batches(received)
        instances = table.column(INSTANCE_COLUMN)
        present = sorted(pc.unique(instances).to_pylist())
        for instance in present:
            rows = ArrowRows(
                table if len(present) == 1 else table.filter(pc.equal(instances, instance)), timezone
            )
            decode_ms = round((time.perf_counter() - began) * 1000, 3)
            yield from run_instance(plan, make_processor, instance, rows, timezone, decode_ms, reports)
            began = time.perf_counter()

    return reporting(process, sender)
